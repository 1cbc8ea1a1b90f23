"""The NCCL flight recorder read safely: torch 2.5's dump format as JSON or as a pickle of plain
containers; a pickle that would run code is refused before anything runs."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

from agent.flightrec import UnsafeDump, dump_rank, last_collective, load_dump


def _dump() -> dict[str, Any]:
    """A dump as torch 2.5 writes one (flight recorder tutorial; components/types.py)."""
    entry = {
        "record_id": 0, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": 41,
        "p2p_seq_id": 0, "op_id": 41, "profiling_name": "nccl:all_reduce", "time_created_ns": 1,
        "input_sizes": [[1024]], "input_dtypes": ["Float"], "output_sizes": [[1024]], "output_dtypes": ["Float"],
        "state": "completed", "time_discovered_started_ns": 2, "time_discovered_completed_ns": 3,
        "retired": True, "timeout_ms": 600000, "is_p2p": False,
        "frames": [{"name": "all_reduce", "filename": "distributed_c10d.py", "line": 2501}],
    }  # fmt: skip
    stuck = {**entry, "record_id": 1, "collective_seq_id": 42, "op_id": 42, "state": "started", "retired": False}
    return {
        "version": "2.4",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}},
        "pg_status": {"0": {"last_enqueued_collective": 42, "last_started_collective": 42,
                            "last_completed_collective": 41}},
        "entries": [entry, stuck],
    }  # fmt: skip


def test_json_and_plain_pickle_dumps_read_the_same() -> None:
    dump = _dump()
    assert load_dump(json.dumps(dump).encode()) == dump
    assert load_dump(pickle.dumps(dump)) == dump
    assert last_collective(dump) == {
        "profiling_name": "nccl:all_reduce",
        "collective_seq_id": 42,
        "pg_id": 0,
        "state": "started",
    }


class _Exploit:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_that_would_run_code_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    hostile = pickle.dumps({"entries": [_Exploit(marker)]})
    with pytest.raises(UnsafeDump, match="refused global"):
        load_dump(hostile)
    assert not marker.exists()
    with pytest.raises(UnsafeDump):
        load_dump(b"\x80\x05garbage")
    with pytest.raises(UnsafeDump, match="not a mapping"):
        load_dump(b"[1, 2]")


def test_dump_rank_through_proc_root_only_where_the_job_enabled_it(tmp_path: Path) -> None:
    """A fake /proc: the rank's environ names the pipe stem and the dump file; its root holds them."""
    proc = tmp_path / "proc"
    (proc / "77" / "root" / "tmp").mkdir(parents=True)
    env = b"TORCH_NCCL_TRACE_BUFFER_SIZE=2000\0TORCH_NCCL_DEBUG_INFO_PIPE_FILE=/tmp/fr_pipe_\0"
    (proc / "77" / "environ").write_bytes(env + b"TORCH_NCCL_DEBUG_INFO_TEMP_FILE=/tmp/fr_dump_\0")
    (proc / "77" / "root" / "tmp" / "fr_dump_3").write_text(json.dumps(_dump()))
    dump = dump_rank(77, 3, str(proc), wait_s=0.1)  # no reader on the (absent) pipe: the last dump is read
    assert dump is not None and last_collective(dump)["collective_seq_id"] == 42  # type: ignore[index]
    (proc / "78" / "root").mkdir(parents=True)
    (proc / "78" / "environ").write_bytes(b"TORCH_NCCL_DEBUG_INFO_PIPE_FILE=/tmp/fr_pipe_\0")  # buffer size 0: off
    assert dump_rank(78, 0, str(proc), wait_s=0.1) is None
