"""FakeAmdSmi against the real amdsmi package's source, parsed, never imported.

The real bindings load libamd_smi.so (ROCm) when imported, so the pinned wheel is downloaded
with pip and read with ``ast``: every function the fake offers must exist in the package with
the same parameter names and return no key the real one cannot; every enum member, status code,
error text and exception class must be the real one. Skips (with the reason) when pip cannot
reach the package index.
"""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

import pytest

from agent.sim import fake_amdsmi
from agent.sim.fake_amdsmi import FakeAmdSmi, FakeProcessorHandle

ROOT = Path(__file__).resolve().parents[3]


def pinned_requirement() -> str:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (req,) = extras["amd"]
    assert re.fullmatch(r"amdsmi==[\d.]+", req), f"the amd extra must pin one version: {req}"
    return req


@dataclass
class RealSource:
    exports: set[str]
    functions: dict[str, ast.FunctionDef]
    enums: dict[str, dict[str, int]]
    wrapper: dict[str, int]
    exceptions: dict[str, list[str]]  # class -> base names
    err_info: dict[int, str]


def _wrapper_constants(tree: ast.Module) -> dict[str, int]:
    out: dict[str, int] = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, int)
        ):
            out[node.targets[0].id] = node.value.value
    return out


def _wrapper_ref(node: ast.expr, wrapper: dict[str, int]) -> int | None:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "amdsmi_wrapper":
        return wrapper.get(node.attr)
    return None


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> RealSource:
    req = pinned_requirement()
    dest = tmp_path_factory.mktemp("amdsmi")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(dest), req],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,  # a failed download skips, below
    )
    wheels = list(dest.glob("amdsmi-*.whl"))
    if proc.returncode != 0 or not wheels:
        pytest.skip(f"cannot download {req}: {proc.stderr.strip().splitlines()[-1:] or proc.returncode}")
    with zipfile.ZipFile(wheels[0]) as whl:
        text = {name.split("/")[-1]: whl.read(name).decode() for name in whl.namelist() if name.startswith("amdsmi/")}
    wrapper = _wrapper_constants(ast.parse(text["amdsmi_wrapper.py"]))
    init = ast.parse(text["__init__.py"])
    exports = {a.asname or a.name for node in ast.walk(init) if isinstance(node, ast.ImportFrom) for a in node.names}
    interface = ast.parse(text["amdsmi_interface.py"])
    functions = {n.name: n for n in interface.body if isinstance(n, ast.FunctionDef)}
    enums: dict[str, dict[str, int]] = {}
    for node in interface.body:
        if isinstance(node, ast.ClassDef) and any(getattr(b, "id", "") == "IntEnum" for b in node.bases):
            members: dict[str, int] = {}
            for stmt in node.body:
                if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
                    value = _wrapper_ref(stmt.value, wrapper)
                    if value is not None:
                        members[stmt.targets[0].id] = value
            enums[node.name] = members
    exc_tree = ast.parse(text["amdsmi_exception.py"])
    exceptions = {n.name: [getattr(b, "id", "") for b in n.bases] for n in exc_tree.body if isinstance(n, ast.ClassDef)}
    err_info: dict[int, str] = {}
    for node in ast.walk(exc_tree):
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values, strict=True):
                code = _wrapper_ref(k, wrapper) if k is not None else None
                if code is not None and isinstance(v, ast.Constant):
                    err_info[code] = v.value
    return RealSource(exports, functions, enums, wrapper, exceptions, err_info)


def _returned_keys(fn: ast.FunctionDef) -> set[str]:
    keys: set[str] = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Dict):
            keys.update(k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str))
    return keys


def fake_functions() -> dict[str, object]:
    return {n: getattr(FakeAmdSmi, n) for n in dir(FakeAmdSmi) if n.startswith("amdsmi_")}


class TestSurface:
    def test_every_function_is_real_with_its_parameter_names(self, real: RealSource) -> None:
        """Each amdsmi_* the fake has is exported by the package and takes the same parameters."""
        assert len(fake_functions()) >= 15
        for name, fn in fake_functions().items():
            assert name in real.exports, f"{name} is not exported by amdsmi"
            want = [a.arg for a in real.functions[name].args.args]
            got = [p for p in inspect.signature(fn).parameters if p != "self"]
            assert got == want, f"{name}{tuple(got)} differs from amdsmi's {tuple(want)}"

    def test_returned_dicts_use_only_real_keys(self, real: RealSource) -> None:
        """Every key a fake read returns is one the real function builds (a typo would be a silent absent)."""
        smi = FakeAmdSmi(gpu_count=1)
        smi.amdsmi_init()
        handle = smi.amdsmi_get_processor_handles()[0]
        args = {
            "amdsmi_get_clock_info": (smi.AmdSmiClkType.GFX,),
            "amdsmi_get_gpu_ecc_count": (smi.AmdSmiGpuBlock.UMC,),
            "amdsmi_get_temp_metric": (smi.AmdSmiTemperatureType.HOTSPOT, smi.AmdSmiTemperatureMetric.CURRENT),
        }
        checked = 0
        for name in fake_functions():
            if name in ("amdsmi_init", "amdsmi_shut_down", "amdsmi_get_processor_handles"):
                continue
            value = getattr(smi, name)(handle, *args.get(name, ()))
            if isinstance(value, dict):
                extra = set(value) - _returned_keys(real.functions[name])
                assert not extra, f"{name} returns keys amdsmi never does: {sorted(extra)}"
                checked += 1
        assert checked >= 10

    def test_enum_members_have_the_real_values(self, real: RealSource) -> None:
        enums = [
            v for v in vars(fake_amdsmi).values() if isinstance(v, type) and issubclass(v, IntEnum) and v is not IntEnum
        ]
        assert len(enums) >= 5
        for enum in enums:
            assert enum.__name__ in real.exports
            for member in enum.__members__:
                assert member in real.enums[enum.__name__], f"{enum.__name__}.{member} is not amdsmi's"
                assert enum[member] == real.enums[enum.__name__][member], f"{enum.__name__}.{member}"

    def test_status_codes_and_error_texts_are_the_real_ones(self, real: RealSource) -> None:
        codes = {k: v for k, v in vars(fake_amdsmi).items() if k.startswith("AMDSMI_STATUS_")}
        assert codes
        for name, value in codes.items():
            assert real.wrapper[name] == value, name
        for code, text in fake_amdsmi._ERR_INFO.items():
            assert real.err_info[code] == text

    def test_exception_classes_are_the_real_hierarchy(self, real: RealSource) -> None:
        names = (
            "AmdSmiException",
            "AmdSmiLibraryException",
            "AmdSmiRetryException",
            "AmdSmiTimeoutException",
            "AmdSmiParameterException",
        )
        for name in names:
            cls = getattr(fake_amdsmi, name)
            assert name in real.exports
            assert [b.__name__ for b in cls.__bases__] == real.exceptions[name]


class TestBehaviour:
    def test_calls_before_init_raise_not_init(self) -> None:
        smi = FakeAmdSmi()
        with pytest.raises(fake_amdsmi.AmdSmiLibraryException) as err:
            smi.amdsmi_get_processor_handles()
        assert err.value.err_code == fake_amdsmi.AMDSMI_STATUS_NOT_INIT
        assert "AMDSMI_STATUS_NOT_INIT" in str(err.value)

    def test_lost_gpu_raises_not_found_and_a_bad_handle_a_parameter_error(self) -> None:
        smi = FakeAmdSmi(gpu_count=2)
        smi.amdsmi_init()
        smi.lose(1)
        with pytest.raises(fake_amdsmi.AmdSmiLibraryException) as err:
            smi.amdsmi_get_gpu_device_uuid(FakeProcessorHandle(1))
        assert err.value.err_code == fake_amdsmi.AMDSMI_STATUS_NOT_FOUND
        with pytest.raises(fake_amdsmi.AmdSmiParameterException):
            smi.amdsmi_get_gpu_device_uuid(1)  # type: ignore[arg-type]

    def test_ras_counts_add_per_block_and_in_the_total(self) -> None:
        smi = FakeAmdSmi(gpu_count=1)
        smi.amdsmi_init()
        h = smi.amdsmi_get_processor_handles()[0]
        smi.inject_ecc(0, smi.AmdSmiGpuBlock.UMC, uncorrectable=2)
        smi.inject_ecc(0, smi.AmdSmiGpuBlock.XGMI_WAFL, uncorrectable=0, correctable=5)
        assert smi.amdsmi_get_gpu_ecc_count(h, smi.AmdSmiGpuBlock.UMC)["uncorrectable_count"] == 2
        total = smi.amdsmi_get_gpu_total_ecc_count(h)
        assert (total["uncorrectable_count"], total["correctable_count"]) == (2, 5)
