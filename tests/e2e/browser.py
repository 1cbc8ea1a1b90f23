"""The interactive browser harness: a real controller (and agents on simulated hardware) and a
headless Chromium driven by Selenium through Debian's ``chromedriver``.

Selenium's calls block, so every one runs in a worker thread (``Browser.call``) while the
controller keeps serving on the test's event loop. Waits are on DOM conditions with a
timeout (``Browser.until``), never on time.

Screenshots are test artifacts: written to ``$STARPULSE_ARTIFACTS`` when set (CI keeps that
folder), else to the test's ``tmp_path`` (pytest keeps the last few runs under
``/tmp/pytest-of-$USER/``).

Needs the Debian packages ``chromium`` and ``chromium-driver``; the tests skip, saying which
is missing, where they are absent.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from controller.detect.correlate import CorrelationConfig
from controller.detect.pipeline import DetectionConfig
from controller.fabric import Fabric
from controller.service import Controller, ControllerConfig
from starpulse.app.scenario.cluster import SimCluster
from starpulse.app.scenario.spec import parse_scenario
from starpulse.core.clock import SYSTEM_CLOCK
from tests.helpers import free_port, wait_for

T = TypeVar("T")
CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
WINDOW = (1400, 1000)
# Headless in a container: no sandbox, no GPU, no /dev/shm, nothing fetched from outside.
CHROMIUM_FLAGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--hide-scrollbars",
)


def _which(env: str, names: tuple[str, ...]) -> str | None:
    override = os.environ.get(env)
    if override:
        return shutil.which(override)
    return next((p for p in map(shutil.which, names) if p), None)


CHROMIUM = _which("STARPULSE_CHROMIUM", CHROMIUM_CANDIDATES)
CHROMEDRIVER = _which("STARPULSE_CHROMEDRIVER", ("chromedriver",))
try:
    import selenium  # noqa: F401

    HAVE_SELENIUM = True
except ImportError:
    HAVE_SELENIUM = False


def skip_reason() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if CHROMIUM is None:
        return "no chromium binary (apt-get install -y --no-install-recommends chromium)"
    if CHROMEDRIVER is None:
        return "no chromedriver (apt-get install -y --no-install-recommends chromium-driver)"
    if not HAVE_SELENIUM:
        return "selenium is not installed (pip install -e '.[dev]')"
    return None


requires_browser = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")


def artifacts_dir(tmp_path: Path) -> Path:
    """Where screenshots go: ``$STARPULSE_ARTIFACTS`` if set, else the test's tmp_path."""
    root = os.environ.get("STARPULSE_ARTIFACTS")
    out = Path(root) if root else tmp_path / "artifacts"
    out.mkdir(parents=True, exist_ok=True)
    return out


class Browser:
    """A Selenium Chrome session whose blocking calls run off the event loop."""

    def __init__(self, driver: Any, artifacts: Path) -> None:
        self.driver = driver
        self.artifacts = artifacts

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(fn, *args)

    async def click(self, by: str, value: str, within_s: float = 10.0) -> None:
        """Find the element and click it; a live view that redrew it in between (a stale
        reference) is found again, as a person would click the redrawn one."""
        from selenium.common.exceptions import StaleElementReferenceException

        deadline = time.monotonic() + within_s
        while True:
            try:
                await self.call(lambda: self.driver.find_element(by, value).click())
                return
            except StaleElementReferenceException:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)

    async def get(self, url: str) -> None:
        """Load ``url``; returns after the load event (Selenium's normal page-load strategy)."""
        await self.call(self.driver.get, url)

    async def js(self, script: str, *args: Any) -> Any:
        return await self.call(self.driver.execute_script, script, *args)

    async def until(self, script: str, what: str, within_s: float = 30.0, *args: Any) -> Any:
        """Wait until the JS expression ``script`` (a function body returning a value) is truthy."""
        from selenium.common.exceptions import TimeoutException
        from selenium.webdriver.support.ui import WebDriverWait

        wait = WebDriverWait(self.driver, within_s, poll_frequency=0.2)
        try:
            return await self.call(wait.until, lambda d: d.execute_script(script, *args))
        except TimeoutException:
            await self.screenshot("timeout")
            raise AssertionError(f"timed out after {within_s}s waiting for {what}") from None

    async def ready(self, within_s: float = 30.0) -> None:
        """The page has drawn the data it has (``<body data-ready="1">``)."""
        await self.until("return document.body && document.body.dataset.ready === '1';", "the page to render", within_s)

    async def screenshot(self, name: str) -> Path:
        path = self.artifacts / f"{name}.png"
        await self.call(self.driver.save_screenshot, str(path))
        return path

    async def png(self) -> bytes:
        data: bytes = await self.call(self.driver.get_screenshot_as_png)
        return data


async def run_chromium(profile: Path, *args: str, within_s: float = 60.0) -> str:
    """Run headless Chromium without blocking the loop the controller serves on; returns stdout."""
    assert CHROMIUM is not None
    proc = await asyncio.create_subprocess_exec(
        CHROMIUM,
        "--headless",
        *CHROMIUM_FLAGS,
        f"--user-data-dir={profile}",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), within_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise AssertionError(f"chromium {args[-2:]} timed out after {within_s}s") from None
    assert proc.returncode == 0, f"chromium exited {proc.returncode}: {err.decode(errors='replace')[-2000:]}"
    return out.decode(errors="replace")


def _start_driver(profile: Path) -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    assert CHROMIUM is not None and CHROMEDRIVER is not None
    opts.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        *CHROMIUM_FLAGS,
        "--force-device-scale-factor=1",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        f"--user-data-dir={profile}",
    ):
        opts.add_argument(arg)
    service = Service(executable_path=CHROMEDRIVER, log_output=str(profile.parent / "chromedriver.log"))
    driver = webdriver.Chrome(options=opts, service=service)
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(30)
    return driver


@contextlib.asynccontextmanager
async def open_browser(tmp_path: Path) -> AsyncIterator[Browser]:
    profile = tmp_path / "chrome-profile"
    profile.mkdir()
    driver = await asyncio.to_thread(_start_driver, profile)
    try:
        yield Browser(driver, artifacts_dir(tmp_path))
    finally:
        await asyncio.to_thread(driver.quit)


def controller_config(tmp_path: Path, fabric: Fabric) -> ControllerConfig:
    """A controller on free ports with quick settling, as the dashboard tests want it."""
    return ControllerConfig(
        listen=f"127.0.0.1:{free_port()}",
        http="127.0.0.1:0",
        db_path=tmp_path / "controller.db",
        fabric=fabric,
        heartbeat_timeout_s=6,
        sweep_interval_s=0.25,
        detection=DetectionConfig(correlation=CorrelationConfig(settle_s=2)),
    )


@dataclass
class Rig:
    controller: Controller
    cluster: SimCluster | None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.controller.http_port}"


SMALL_CLUSTER = {"nodes": 8, "gpus_per_node": 8, "rails": 4, "nodes_per_block": 4, "spines": 2}


@contextlib.asynccontextmanager
async def fabric_only_rig(tmp_path: Path, fabric: Fabric) -> AsyncIterator[Rig]:
    """A controller with a declared fabric and no agents (every node "never seen")."""
    controller = Controller(controller_config(tmp_path, fabric), clock=SYSTEM_CLOCK)
    await controller.start()
    try:
        yield Rig(controller, None)
    finally:
        await controller.stop()


@contextlib.asynccontextmanager
async def sim_rig(tmp_path: Path) -> AsyncIterator[Rig]:
    """A controller and one simulated agent per node (and switch), every agent reporting."""
    scenario = parse_scenario({"name": "browser", "fabric": SMALL_CLUSTER, "interval_s": 1.0, "duration_s": 120})
    async with fabric_only_rig(tmp_path, scenario.build_fabric()) as bare:
        controller = bare.controller
        cluster = SimCluster(scenario, tmp_path, f"127.0.0.1:{controller.grpc_port}")
        try:
            await cluster.start()
            await wait_for(
                lambda: all(
                    (rec := controller.registry.nodes.get(n)) is not None and rec.latest_report is not None
                    for n in cluster.agents
                ),
                timeout=40,
                what="every agent registered and reported",
            )
            yield Rig(controller, cluster)
        finally:
            await cluster.stop()


__all__ = [
    "Browser",
    "Rig",
    "artifacts_dir",
    "fabric_only_rig",
    "open_browser",
    "requires_browser",
    "run_chromium",
    "sim_rig",
    "skip_reason",
]
