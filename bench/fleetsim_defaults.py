"""Defaults set by measurement (issue 28 item 6): the spare share, the eviction budget and the
circuit breaker, from the fleet simulator (the controller's own decision code) on the default
mix (Llama 3), with one job spanning every working node, as `starpulse simulate` runs it.

    python -m bench.fleetsim_defaults                       # every part (about 15 minutes on 2 cores)
    python -m bench.fleetsim_defaults --part spares         # spares | budget | breaker
    python -m bench.fleetsim_defaults --days 30 --seeds 1,2 # shorter

Spares: for each count, ETTR and the share of the job's time spent waiting for capacity, at
2,048 and at 256 working nodes, over several seeds (the wait is a tail: a burst of faults with
long repairs). The pick is the smallest share with no wait in any seed and ETTR within 0.5 %
of the plateau (the largest count's ETTR). Budget: refusals per budget on the same runs'
faults. Breaker: trips on the mix at 1x and 3x its rate, and a mass event (10 % of the working
nodes with a GPU fault within a minute) at each breaker share. Figures go to bench/README.md
(issue 28, "Defaults set by measurement").
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
from typing import Any

from bench.common import quiet_logging, write_result
from controller.heal.guards import GuardConfig, breaker_threshold
from controller.heal.ladder import RepairPolicy
from controller.heal.scheduler.sim import SimScheduler
from controller.settings import ControllerConfig, HealSettings
from starpulse.app.fleetsim.engine import DAY_S, Fault, JobSpec, SimSettings, draw_faults, sim_fabric, simulate
from starpulse.app.fleetsim.mix import Mix, load_mix
from starpulse.core.logs import configure_logging

NAME = "fleetsim_defaults"
SPARES = {2048: (8, 10, 12, 14, 16, 20, 32), 256: (0, 1, 2, 3, 4, 6)}
BUDGETS = (1, 2, 3, 4)
BREAKER_SHARES = (0.5, 0.1, 0.05, 0.02)
MASS_SHARE = 0.10  # of the working nodes, within MASS_SPREAD_S
MASS_SPREAD_S = 60.0


def job_settings(nodes: int, spares: int, days: float, seed: int, rate_scale: float = 1.0) -> SimSettings:
    """`starpulse simulate`'s defaults: one job over every working node, checkpoint 30 min, write 60 s,
    restart 10 min."""
    job = JobSpec("job-0", nodes, 1800.0, 60.0, 600.0)
    return SimSettings(nodes, spares, days, (job,), seed=seed, rate_scale=rate_scale)


def config(**guards: Any) -> ControllerConfig:
    """The controller's default settings, with these guard settings changed."""
    base = ControllerConfig(heal=HealSettings(SimScheduler([])))
    assert base.heal is not None
    g = dataclasses.replace(base.heal.guards, **guards)
    return dataclasses.replace(base, heal=dataclasses.replace(base.heal, guards=g))


def _row(r: dict[str, Any]) -> dict[str, Any]:
    keys = ("ettr", "capacity_wait_share", "evictions", "spares_used", "evictions_without_spare",
            "breaker_trips", "refused", "wall_s")  # fmt: skip
    return {k: r[k] for k in keys}


def spares(mix: Mix, days: float, seeds: list[int], table: dict[int, tuple[int, ...]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for nodes, counts in table.items():
        rows = []
        for n in counts:
            runs = [_row(simulate(job_settings(nodes, n, days, s), mix, config()).to_dict()) for s in seeds]
            rows.append({
                "spares": n, "share_pct": 100 * n / nodes,
                "ettr_mean": statistics.fmean(r["ettr"] for r in runs),
                "ettr_min": min(r["ettr"] for r in runs),
                "wait_max": max(r["capacity_wait_share"] for r in runs),
                "wait_mean": statistics.fmean(r["capacity_wait_share"] for r in runs),
                "without_spare_mean": statistics.fmean(r["evictions_without_spare"] for r in runs),
                "runs": runs,
            })  # fmt: skip
            print(f"  {nodes} nodes, {n:>2} spares ({100 * n / nodes:.2f} %): ETTR {rows[-1]['ettr_mean']:.4f} "
                  f"(min {rows[-1]['ettr_min']:.4f}), waiting max {100 * rows[-1]['wait_max']:.2f} % "
                  f"mean {100 * rows[-1]['wait_mean']:.2f} %", flush=True)  # fmt: skip
        plateau = rows[-1]["ettr_mean"]
        pick = next(
            (r for r in rows if r["wait_max"] < 1e-4 and r["ettr_mean"] >= plateau * 0.995),
            None,
        )
        out[str(nodes)] = {"rows": rows, "plateau_ettr": plateau, "pick": pick and pick["spares"],
                           "pick_share_pct": pick and pick["share_pct"]}  # fmt: skip
        print(f"  {nodes} nodes: plateau ETTR {plateau:.4f}; smallest with no wait and within 0.5 %: "
              f"{pick and pick['spares']} spares ({pick and round(pick['share_pct'], 2)} %)", flush=True)  # fmt: skip
    return out


def budget(
    mix: Mix,
    days: float,
    seeds: list[int],
    nodes: int,
    spares_n: int,
    budgets: tuple[int, ...] = BUDGETS,
    scales: tuple[float, ...] = (1.0, 3.0),
) -> dict[str, Any]:
    rows = []
    for b in budgets:
        for scale in scales:
            runs = [
                _row(simulate(job_settings(nodes, spares_n, days, s, scale), mix,
                              config(max_evictions_per_window=b)).to_dict())
                for s in seeds
            ]  # fmt: skip
            refused = sum(sum(r["refused"].values()) for r in runs)
            rows.append({"budget": b, "rate_scale": scale, "refused_total": refused,
                         "refused_by_kind": _sum_kinds(r["refused"] for r in runs),
                         "ettr_mean": statistics.fmean(r["ettr"] for r in runs), "runs": runs})  # fmt: skip
            print(f"  budget {b} per 10 min, rate x{scale:g}: refused {refused} over {len(seeds)} runs "
                  f"{rows[-1]['refused_by_kind']}, ETTR {rows[-1]['ettr_mean']:.4f}", flush=True)  # fmt: skip
    return {"nodes": nodes, "spares": spares_n, "rows": rows}


def _sum_kinds(dicts: Any) -> dict[str, int]:
    total: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            total[k] = total.get(k, 0) + v
    return total


def busiest_window(trace: list[Fault], mix: Mix, window_s: float) -> int:
    """The most distinct nodes with an incident-raising fault in any ``window_s`` of the trace."""
    raising = {c.name for c in mix.causes if c.rule is not None}
    times = [(f.at_s, f.node) for f in trace if f.cause in raising]
    best, lo = 0, 0
    for hi in range(len(times)):
        while times[hi][0] - times[lo][0] > window_s:
            lo += 1
        best = max(best, len({n for _, n in times[lo : hi + 1]}))
    return best


def mass_trace(mix: Mix, settings: SimSettings, at_s: float) -> list[Fault]:
    """The mix's own faults plus a mass event: MASS_SHARE of the working nodes lose a GPU within
    MASS_SPREAD_S of ``at_s`` (a bad driver push, a power event)."""
    fabric = sim_fabric(settings)
    nodes = list(fabric.nodes())
    working = [n for n in nodes if not fabric.is_spare(n)]
    rng = random.Random(settings.seed)
    hit = rng.sample(working, max(1, round(MASS_SHARE * len(working))))
    burst = [Fault(at_s + rng.uniform(0, MASS_SPREAD_S), n, "faulty_gpu") for n in hit]
    return sorted(draw_faults(mix, settings, nodes) + burst)


def busiest(mix: Mix, days: float, seeds: list[int], fleets: list[int]) -> list[dict[str, Any]]:
    """The trace alone (no simulation): the most nodes faulting in any breaker window, at 1x and 3x."""
    window = GuardConfig().breaker_window_s
    rows = []
    for nodes in fleets:
        for scale in (1.0, 3.0):
            found = []
            for s in seeds:
                st = job_settings(nodes, 0, days, s, scale)
                found.append(busiest_window(draw_faults(mix, st, list(sim_fabric(st).nodes())), mix, window))
            rows.append({"nodes": nodes, "rate_scale": scale, "busiest_5min_nodes": found})
            print(f"  {nodes} nodes, mix x{scale:g}: at most {found} nodes in any 5 minutes", flush=True)
    return rows


def breaker(mix: Mix, days: float, seeds: list[int], spare_share_pct: float) -> dict[str, Any]:
    out: dict[str, Any] = {"normal": [], "mass": []}
    window = GuardConfig().breaker_window_s
    for nodes in (2048, 256):
        spares_n = RepairPolicy(spare_share_pct=spare_share_pct).spare_target_for(nodes)
        for scale in (1.0, 3.0):
            for s in seeds:
                st = job_settings(nodes, spares_n, days, s, scale)
                fabric = sim_fabric(st)
                busiest = busiest_window(draw_faults(mix, st, list(fabric.nodes())), mix, window)
                out["normal"].append({"nodes": nodes, "rate_scale": scale, "seed": s, "busiest_5min_nodes": busiest})
        worst = max(r["busiest_5min_nodes"] for r in out["normal"] if r["nodes"] == nodes)
        print(f"  {nodes} nodes: at most {worst} nodes with a fault in any 5 minutes "
              f"(mix at 1x and 3x, {len(seeds)} seeds of {days:g} days)", flush=True)  # fmt: skip
        st = job_settings(nodes, spares_n, min(days, 2.0), seeds[0])
        trace = mass_trace(mix, st, DAY_S / 2)
        for share in BREAKER_SHARES:
            r = simulate(st, mix, config(breaker_trip_share=share), trace=trace).to_dict()
            need = breaker_threshold(config(breaker_trip_share=share).heal.guards, nodes + spares_n)  # type: ignore[union-attr]
            out["mass"].append({"nodes": nodes, "breaker_trip_share": share, "trip_at_nodes": need,
                                "mass_nodes": round(MASS_SHARE * nodes), **_row(r)})  # fmt: skip
            print(f"  {nodes} nodes, mass event ({round(MASS_SHARE * nodes)} nodes in {MASS_SPREAD_S:g} s), "
                  f"breaker share {share:g} (trips at {need:g}): trips {r['breaker_trips']}, "
                  f"evictions {r['evictions']}, refused {r['refused']}", flush=True)  # fmt: skip
        for share in BREAKER_SHARES[1:]:  # the lower shares at normal rates, through the real guards
            st = job_settings(nodes, spares_n, days, seeds[0], 3.0)
            r = simulate(st, mix, config(breaker_trip_share=share)).to_dict()
            out["normal"].append({"nodes": nodes, "rate_scale": 3.0, "seed": seeds[0], "breaker_trip_share": share,
                                  "breaker_trips": r["breaker_trips"]})  # fmt: skip
            print(f"  {nodes} nodes, mix x3, breaker share {share:g}: trips {r['breaker_trips']}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("spares", "budget", "breaker", "busiest"), action="append")
    parser.add_argument("--days", type=float, default=60.0)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--budget-nodes", type=int, default=2048)
    parser.add_argument("--spare-share", type=float, default=1.2, help="percent, for the budget and breaker runs")
    parser.add_argument("--budgets", default=None, help="budget part: these budgets (evictions per 10 min)")
    parser.add_argument("--scales", default=None, help="budget part: these multiples of the mix's rate (1,3)")
    parser.add_argument("--fleet", type=int, action="append", help="spares part: these fleet sizes only")
    parser.add_argument("--counts", default=None, help="spares part: these spare counts (with one --fleet)")
    args = parser.parse_args()
    parts = args.part or ["spares", "budget", "breaker", "busiest"]
    seeds = [int(s) for s in args.seeds.split(",")]
    quiet_logging()
    configure_logging("error")
    mix = load_mix()
    figures: dict[str, Any] = {}
    if "spares" in parts:
        print("spares (a job over every working node; waiting = its time down for want of nodes):")
        table = {n: SPARES.get(n, ()) for n in args.fleet} if args.fleet else SPARES
        if args.counts:
            table = {n: tuple(int(c) for c in args.counts.split(",")) for n in table}
        figures["spares"] = spares(mix, args.days, seeds, table)
    spares_n = RepairPolicy(spare_share_pct=args.spare_share).spare_target_for(args.budget_nodes)
    if "budget" in parts:
        print(f"eviction budget ({args.budget_nodes} nodes + {spares_n} spares):")
        budgets = tuple(int(b) for b in args.budgets.split(",")) if args.budgets else BUDGETS
        scales = tuple(float(x) for x in args.scales.split(",")) if args.scales else (1.0, 3.0)
        figures["budget"] = budget(mix, args.days, seeds, args.budget_nodes, spares_n, budgets, scales)
    if "breaker" in parts:
        print("circuit breaker:")
        figures["breaker"] = breaker(mix, args.days, seeds, args.spare_share)
    if "busiest" in parts:
        print("faulty nodes in the breaker's window, independent faults only:")
        figures["busiest"] = busiest(mix, args.days, seeds, args.fleet or [2048, 10000])
    params = {"days": args.days, "seeds": seeds, "parts": parts, "spare_share": args.spare_share,
              "fleet": args.fleet, "counts": args.counts, "budget_nodes": args.budget_nodes,
              "budgets": args.budgets, "scales": args.scales}  # fmt: skip
    name = NAME + "".join(f"_{p}" for p in parts) + "".join(f"_{n}" for n in args.fleet or ())
    if parts == ["budget"] and args.budget_nodes != 2048:  # another fleet size: its own file
        name += f"_{args.budget_nodes}"
    if args.counts and parts == ["spares"] and len(args.counts) < 12:  # a short extra sweep: its own file
        name += "_c" + args.counts.replace(",", "-")
    print(f"written {write_result(name, params, figures)}")


if __name__ == "__main__":
    main()
