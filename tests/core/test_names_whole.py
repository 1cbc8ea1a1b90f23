"""Issue 32 item 3: every name is checked whole. ``re.match(r"^...$")`` accepts a trailing
newline (``$`` matches before a final ``\\n``), and these names reach schedulers, commands and
stores; each check below must refuse the name with a newline (or other junk) after it."""

from __future__ import annotations

import pytest

from agent.commands import InvalidArgs, _validate, is_configurable
from controller.heal.scheduler.base import validate_job_id
from controller.heal.scheduler.slurm import validate_slurm_job_id
from starpulse.core.names import InvalidName, validate_node_id


@pytest.mark.parametrize("suffix", ["\n", "\r\n", "\n; rm -rf /", " "])
def test_node_id_checked_whole(suffix: str) -> None:
    assert validate_node_id("node-000") == "node-000"
    with pytest.raises(InvalidName):
        validate_node_id("node-000" + suffix)


def test_job_ids_checked_whole() -> None:
    assert validate_job_id("ns/train-1") == "ns/train-1"
    assert validate_slurm_job_id("123_4") == "123_4"
    with pytest.raises(InvalidName):
        validate_job_id("train-1\n")
    with pytest.raises(InvalidName):
        validate_slurm_job_id("123\n")


def test_command_values_checked_whole() -> None:
    assert _validate("name", "dcgm_r1") == "dcgm_r1"
    with pytest.raises(InvalidArgs):
        _validate("name", "dcgm_r1\n")
    assert is_configurable("diagnostic.dcgm")
    assert not is_configurable("diagnostic.dcgm\n")
