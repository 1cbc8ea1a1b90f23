"""MindCluster's fault-code levels as shipped with the agent, row by row against the product's table.

The product's table is read in place from ../shared/fixtures/vendors/ascend/fault-codes.mindcluster.json
(the row tests skip, with the reason, where it is absent); the shipped facts are
agent/collectors/accel/ascend_fault_levels.json, used by default by the Ascend backend and the
kernel-log family.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.collectors.accel import ascend_faults as faults
from agent.collectors.accel.ascend import AscendNpuCollector
from agent.sim.fake_npu_smi import FakeNpuSmi
from starpulse.v1 import telemetry_pb2 as tpb

PRODUCT = (
    Path(__file__).resolve().parents[5] / "shared" / "fixtures" / "vendors" / "ascend" / "fault-codes.mindcluster.json"
)
# faultCode.json files A2301001 under RestartBusiness and SeparateNPU; the shipped table keeps the worse.
RESOLVED = {"A2301001": "SeparateNPU"}


def _rows() -> list[dict]:
    if not PRODUCT.is_file():
        return []
    return list(json.loads(PRODUCT.read_text())["codes"])


ROWS = _rows()


def test_the_product_table_is_here_or_the_rows_are_skipped() -> None:
    if not ROWS:
        pytest.skip(f"MindCluster's table not here: {PRODUCT}")
    assert len(ROWS) > 800


@pytest.mark.parametrize("row", ROWS, ids=[f"{r['code']}-{r['mindcluster_level']}" for r in ROWS])
def test_each_code_has_the_products_level(row: dict) -> None:
    """A listed code has MindCluster's level; a code faultCode.json does not list is not in the table."""
    shipped = faults.default_levels().get(row["code"].upper())
    if row["mindcluster_level"] is None:
        assert shipped is None
    else:
        assert shipped == RESOLVED.get(row["code"], row["mindcluster_level"])


def test_the_shipped_table_holds_nothing_the_product_does_not() -> None:
    if not ROWS:
        pytest.skip(f"MindCluster's table not here: {PRODUCT}")
    listed = {r["code"].upper() for r in ROWS if r["mindcluster_level"]}
    assert set(faults.default_levels()) == listed


def test_the_shipped_table_names_its_source_and_every_level_has_an_action() -> None:
    doc = json.loads(faults.DEFAULT_TABLE.read_text())
    assert "Ascend/mind-cluster" in doc["source"]["repo"] and doc["source"]["file"].endswith("faultCode.json")
    assert set(doc["levels"]) == set(faults.LEVEL_ACTION)


def test_the_backend_uses_the_table_by_default() -> None:
    """A RestartNPU code resets the chip, a RestartBusiness one re-runs the job: not vendor support."""
    fake = FakeNpuSmi(npu_count=2)
    fake.inject(0, "80E18005")  # HBMC parity error: RestartNPU
    fake.inject(1, "80E01801")  # HBM multi-bit ECC on access: RestartBusiness
    found = AscendNpuCollector(fake).collect(tpb.Report())
    assert {(f.vendor_code, f.action, f.attributes["level"]) for f in found} == {
        ("80E18005", "reset_gpu", "RestartNPU"),
        ("80E01801", "restart_app", "RestartBusiness"),
    }


def test_an_operator_table_in_the_shipped_shape_is_read(tmp_path: Path) -> None:
    table = tmp_path / "levels.json"
    table.write_text('{"levels": {"RestartNPU": ["80e01801"]}}')
    assert faults.load_fault_levels(table) == {"80E01801": "RestartNPU"}
    table.write_text('{"levels": {"RestartNPU": "80e01801"}}')
    with pytest.raises(faults.FaultCodeError) as err:
        faults.load_fault_levels(table)
    assert str(table) in str(err.value) and "\n" not in str(err.value)
