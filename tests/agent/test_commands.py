"""The agent's command handler: checkpoint requests reach the job; disruptive commands run
only where configured, with validated arguments and no shell."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from agent.commands import CommandHandler, kind_name, render_argv
from agent.jobs import JobGateway
from starpulse.job import StarpulseJob
from starpulse.v1 import service_pb2 as spb
from tests.helpers import wait_for


@pytest.fixture
def short_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="spc-", dir="/tmp") as d:
        yield Path(d)


@pytest.fixture
async def gateway(short_dir: Path) -> AsyncIterator[JobGateway]:
    gw = JobGateway(str(short_dir / "jobs.sock"))
    await gw.start()
    try:
        yield gw
    finally:
        await gw.close()


def cmd(kind: int, **args: str) -> spb.Command:
    return spb.Command(id="c1", kind=kind, args=args)  # type: ignore[arg-type]


def test_kind_names() -> None:
    assert kind_name(spb.COMMAND_KIND_GPU_RESET) == "gpu_reset"
    assert kind_name(spb.COMMAND_KIND_CHECKPOINT_REQUEST) == "checkpoint_request"
    assert kind_name(99) == "unknown_99"


async def test_checkpoint_request_reaches_the_job(gateway: JobGateway, short_dir: Path) -> None:
    job = StarpulseJob("llm", checkpoint_dir=short_dir / "ck", socket_path=gateway.socket_path, signal_number=None)
    handler = CommandHandler(gateway, {})
    try:
        assert job.register()
        job.step(1, 0.1)
        await wait_for(lambda: len(gateway.ranks()) == 1, timeout=5, what="registration")
        result = await handler(cmd(spb.COMMAND_KIND_CHECKPOINT_REQUEST, job="llm"))
        assert result.id == "c1" and result.ok, result.message
        assert "1 rank" in result.message
        await wait_for(lambda: job.checkpoint_requested, timeout=5, what="the request at the job")
        missing = await handler(cmd(spb.COMMAND_KIND_CHECKPOINT_REQUEST, job="nope"))
        assert not missing.ok and "no registered ranks" in missing.message
    finally:
        job.close()


async def test_checkpoint_request_without_gateway() -> None:
    result = await CommandHandler(None)(cmd(spb.COMMAND_KIND_CHECKPOINT_REQUEST))
    assert not result.ok and "no job gateway" in result.message


async def test_gpu_reset_and_reboot_refused_when_not_allowed() -> None:
    handler = CommandHandler(None, {"run_diagnostic": ["/bin/true"]})
    for kind in (spb.COMMAND_KIND_GPU_RESET, spb.COMMAND_KIND_REBOOT):
        result = await handler(cmd(kind, gpu="0"))
        assert not result.ok and "not allowed on this node" in result.message


async def test_allowed_gpu_reset_runs_with_gpu_substituted(short_dir: Path) -> None:
    out = short_dir / "argv.txt"
    # No shell: the argv is exec'd as is; a python one-liner records what it received.
    template = [
        sys.executable,
        "-c",
        f"import sys; open({str(out)!r}, 'w').write(' '.join(sys.argv[1:]))",
        "-r",
        "-i",
        "{gpu}",
    ]
    handler = CommandHandler(None, {"gpu_reset": template})
    result = await handler(cmd(spb.COMMAND_KIND_GPU_RESET, gpu="3"))
    assert result.ok, result.message
    assert out.read_text() == "-r -i 3"
    true = await CommandHandler(None, {"gpu_reset": ["/bin/true", "{gpu}"]})(cmd(spb.COMMAND_KIND_GPU_RESET, gpu="7"))
    assert true.ok and true.message.startswith("/bin/true ok")


@pytest.mark.parametrize("gpu", ["x", "-1", "3; reboot", "$(id)", "1 2", "99999"])
async def test_gpu_arg_validated(gpu: str) -> None:
    handler = CommandHandler(None, {"gpu_reset": ["/bin/true", "-i", "{gpu}"]})
    result = await handler(cmd(spb.COMMAND_KIND_GPU_RESET, gpu=gpu))
    assert not result.ok and result.message.startswith("refused:")


async def test_missing_arg_failure_and_timeout() -> None:
    missing = await CommandHandler(None, {"gpu_reset": ["/bin/true", "{gpu}"]})(cmd(spb.COMMAND_KIND_GPU_RESET))
    assert not missing.ok and "missing arg 'gpu'" in missing.message
    failing = await CommandHandler(None, {"reboot": ["/bin/false"]})(cmd(spb.COMMAND_KIND_REBOOT))
    assert not failing.ok and "exited 1" in failing.message
    slow = CommandHandler(None, {"reboot": ["/bin/sleep", "5"]}, timeout_s=0.2)
    result = await slow(cmd(spb.COMMAND_KIND_REBOOT))
    assert not result.ok and "timed out" in result.message
    absent = await CommandHandler(None, {"reboot": ["/nonexistent/tool"]})(cmd(spb.COMMAND_KIND_REBOOT))
    assert not absent.ok and "cannot run" in absent.message


async def test_diagnostic_builtin_or_configured(gateway: JobGateway) -> None:
    builtin = await CommandHandler(gateway)(cmd(spb.COMMAND_KIND_RUN_DIAGNOSTIC))
    assert builtin.ok and builtin.message.startswith("built-in diagnostic:") and "job_ranks=0" in builtin.message
    configured = await CommandHandler(gateway, {"run_diagnostic": ["/bin/echo", "dcgm", "{level}"]})(
        cmd(spb.COMMAND_KIND_RUN_DIAGNOSTIC, level="1")
    )
    assert configured.ok and "dcgm 1" in configured.message


def test_bad_configuration_rejected_at_startup() -> None:
    with pytest.raises(ValueError, match="unknown command kinds"):
        CommandHandler(None, {"format_disk": ["/bin/true"]})
    with pytest.raises(ValueError, match="empty argv"):
        CommandHandler(None, {"reboot": []})
    with pytest.raises(ValueError):
        CommandHandler(None, {"reboot": ["/bin/true", "{0}"]})


def test_render_argv_values() -> None:
    assert render_argv(["tool", "--id={gpu}", "{node}"], {"gpu": "02", "node": "gpu-001"}) == [
        "tool",
        "--id=2",
        "gpu-001",
    ]
    with pytest.raises(ValueError):
        render_argv(["tool", "{node}"], {"node": "--force"})
