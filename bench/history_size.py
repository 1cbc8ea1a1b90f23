"""The controller database after a simulated month at 10,000 nodes (issue 28 item 4).

The simulator writes what the live controller would (nodes, incidents and their history, the
remediation transitions and repairs, job records, the in-service intervals); raw events are
added at a stated rate through the store's own insert (the simulator feeds detection condition
changes, not events). Then the retention sweep runs at a horizon shorter than the month, to
show what stays: the file's live pages (SQLite reuses freed pages, so the file stops growing
once the horizon is full).

    python -m bench.history_size                       # 10,000 nodes, 30 days, 2 events per node-day
    python -m bench.history_size --nodes 2000 --days 10
"""

from __future__ import annotations

import argparse
import dataclasses
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import quiet_logging, write_result
from controller.query.history import HistoryKeeper
from controller.store import Store
from starpulse.app.fleetsim.engine import START_MS, JobSpec, SimSettings, simulate
from starpulse.app.fleetsim.mix import load_mix
from starpulse.core.logs import configure_logging
from starpulse.v1 import telemetry_pb2 as tpb

NAME = "history_size"
DAY_MS = 86_400_000


def live_bytes(path: Path) -> dict[str, int]:
    conn = sqlite3.connect(str(path))
    try:
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        rows = {
            t: conn.execute(f'SELECT COUNT(*) FROM "{t}"').fetchone()[0]
            for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
        }
    finally:
        conn.close()
    return {
        "file_bytes": page * pages,
        "live_bytes": page * (pages - free),
        **{f"rows.{k}": v for k, v in rows.items()},
    }


def add_events(path: Path, days: float, per_node_day: float) -> int:
    """Events at the stated rate, a day's batch per node, as an agent's stream would bring them."""
    store = Store(path)
    written = 0
    try:
        per_day = max(1, round(per_node_day))
        nodes = [n.node_id for n in store.load_nodes()]
        for day in range(int(days)):
            at = START_MS + day * DAY_MS
            for node in nodes:
                events = [
                    tpb.Event(seq=day * per_day + i + 1, timestamp_ms=at + i * 1000, kind=tpb.EVENT_KIND_XID,
                              severity=tpb.SEVERITY_WARNING, component=f"{node}/gpu-{i % 8}", xid=43,
                              message="NVRM: Xid (PCI:0000:9b:00): 43, pid=1234, Ch 00000008", source="kmsg")
                    for i in range(per_day)
                ]  # fmt: skip
                written += store.insert_events(node, "ep", events, at, day * per_day + per_day)
    finally:
        store.close()
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--events-per-node-day", type=float, default=2.0)
    parser.add_argument("--horizon-days", type=float, default=7.0, help="the retention sweep's horizon at the end")
    args = parser.parse_args()
    quiet_logging()
    configure_logging("error")
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder:
        db = Path(folder) / "month.db"
        settings = SimSettings(args.nodes, 0, args.days, (JobSpec("llm", args.nodes),), seed=2)
        started = time.perf_counter()
        result = simulate(dataclasses.replace(settings, spares=max(1, args.nodes // 128)), load_mix(), db_path=db)
        figures["simulated_s"] = time.perf_counter() - started
        figures["faults"] = sum(result.faults.values())
        figures["after_simulation"] = live_bytes(db)
        started = time.perf_counter()
        figures["events_written"] = add_events(db, args.days, args.events_per_node_day)
        figures["events_s"] = time.perf_counter() - started
        figures["after_events"] = live_bytes(db)
        conn = sqlite3.connect(str(db), isolation_level=None)
        deleted = HistoryKeeper(conn, args.horizon_days * 86400).sweep(START_MS + int(args.days * DAY_MS))
        conn.close()
        figures["swept"] = deleted
        figures["after_sweep"] = live_bytes(db)
    for key in ("after_simulation", "after_events", "after_sweep"):
        f = figures[key]
        print(f"{key}: file {f['file_bytes'] / 1e6:.1f} MB, live {f['live_bytes'] / 1e6:.1f} MB, "
              f"events {f.get('rows.events', 0):,}, incidents {f.get('rows.incidents', 0):,}, "
              f"reliability_daily {f.get('rows.reliability_daily', 0):,}, "
              f"per job {f.get('rows.reliability_job_daily', 0):,}, "
              f"per node {f.get('rows.reliability_node_daily', 0):,}")  # fmt: skip
    print(f"{figures['faults']} faults simulated in {figures['simulated_s']:.1f} s; "
          f"{figures['events_written']:,} events written in {figures['events_s']:.1f} s")  # fmt: skip
    path = write_result(NAME, vars(args), figures)
    print(f"written {path}")


if __name__ == "__main__":
    main()
