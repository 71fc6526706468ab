"""The learner on every model origin, simulated (no sockets, no sleeping).

    python bench/sim.py                  # the long version of every scenario
    python bench/sim.py --scale 0.3 --only site-wide,mixed
    python bench/sim.py --warm           # learned mode cold, then warm from what it learned
    python bench/sim.py --seeds 8        # each row the mean of seeds 1-8 (how a change is judged)
    python bench/sim.py --seeds 8 --set start_rate=4   # a control-law knob changed
"""

from __future__ import annotations

import argparse
import math
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import fields, replace

from scrapy_exitlimit.core.limiter import Tuning
from scrapy_exitlimit.sim import SCENARIOS, format_table, table
from scrapy_exitlimit.sim.crawl import Result, simulate
from scrapy_exitlimit.sim.scenarios import Row, jobs, mean_rows, run

TUNING_FIELDS = {f.name for f in fields(Tuning)}


def warm_table(scale: float, names: list[str], seed: int,
               tuning: dict[str, float] | None = None) -> str:
    """Each scenario in learned mode twice: cold, then from the cold run's learned state
    (EXITLIMIT_STATE_FILE); the whole run and its first second."""
    lines = [f"{'scenario':16} {'run':5} {'429 %':>7} {'util':>6} {'1st s util':>10} "
             f"{'1st s 429':>9} {'3 s 429':>7}"]
    for sc in SCENARIOS:
        if names and sc.name not in names:
            continue
        # each run on a crawl built anew: the origin models keep their limiters' state
        cold = simulate(replace(sc.build(scale), seed=seed, tuning=dict(tuning or {})))
        warm = simulate(replace(sc.build(scale), seed=seed, tuning=dict(tuning or {}),
                                learned=cold.learned))
        for phase, r in (("cold", cold), ("warm", warm)):
            lines.append(f"{sc.name:16} {phase:5} {100 * r.share_429:7.2f} "
                         f"{_util(sc, r):6.3f} {_first(sc, r, 1.0)[0]:10.3f} "
                         f"{_first(sc, r, 1.0)[1]:9d} {_first(sc, r, 3.0)[1]:7d}")
    return "\n".join(lines)


def seeds_table(scale: float, names: list[str], seeds: int, tuning: dict[str, float],
                workers: int) -> list[Row]:
    """Every row as the mean of seeds 1..``seeds``, the runs spread over ``workers``
    processes (each run is deterministic, so the table is the same however spread)."""
    todo = [(sc.name, mode) for sc, mode in jobs(names)]
    args = [(name, mode, scale, seed, tuning) for name, mode in todo
            for seed in range(1, seeds + 1)]
    if workers <= 1:
        rows = [_run_one(a) for a in args]
    else:
        with ProcessPoolExecutor(workers) as pool:
            rows = list(pool.map(_run_one, args))
    return [mean_rows(rows[i * seeds:(i + 1) * seeds]) for i in range(len(todo))]


def _run_one(a: tuple[str, str, float, int, dict[str, float]]) -> Row:
    name, mode, scale, seed, tuning = a
    return run(next(sc for sc in SCENARIOS if sc.name == name), mode, scale, seed, tuning)


def parse_tuning(pairs: list[str]) -> dict[str, float]:
    """``NAME=VALUE`` pairs for ``core.limiter.Tuning`` fields; anything else is an error
    naming what is allowed."""
    out = {}
    for item in pairs:
        name, sep, value = item.partition("=")
        if not sep or name not in TUNING_FIELDS:
            raise SystemExit(f"--set {item!r}: expected NAME=VALUE with NAME one of "
                             f"{', '.join(sorted(TUNING_FIELDS))}")
        try:
            out[name] = float(value)
        except ValueError:
            raise SystemExit(f"--set {item!r}: {value!r} is not a number") from None
    return out


def _util(sc, r: Result) -> float:
    if sc.ideal is None or not r.wall:
        return math.nan
    return sc.ideal(r.ok) / r.wall


def _first(sc, r: Result, seconds: float) -> tuple[float, int]:
    """(clean answers in the first ``seconds`` over what the origin allowed, 429s)."""
    statuses = [s for at, _, s in r.answers if at < seconds]
    ok = statuses.count(200)
    if sc.ideal is None:
        return math.nan, statuses.count(429)
    return sc.ideal(ok) / seconds, statuses.count(429)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=1.0, help="pages, as a share of the long run")
    ap.add_argument("--only", default="", help="comma-separated scenario names")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--warm", action="store_true",
                    help="warm start: learned mode cold, then from what the cold run learned")
    ap.add_argument("--seeds", type=int, default=0,
                    help="each row the mean over seeds 1..N (utilization, 429 share; pages "
                         "summed) instead of --seed alone")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                    help="--seeds: processes to spread the runs over (default: one per CPU)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a control-law knob (a core.limiter.Tuning field, e.g. "
                         "start_rate=4) over the crawl defaults; repeatable")
    args = ap.parse_args()
    tuning = parse_tuning(args.set)
    if args.seeds < 0 or args.seeds and args.warm:
        raise SystemExit("--seeds: a positive number, and not with --warm")
    started = time.perf_counter()
    names = [n for n in args.only.split(",") if n]
    unknown = set(names) - {sc.name for sc in SCENARIOS}
    if unknown:
        raise SystemExit(f"--only: no scenario {', '.join(sorted(unknown))}")
    if args.warm:
        print(warm_table(args.scale, names, args.seed, tuning))
    elif args.seeds:
        print(format_table(seeds_table(args.scale, names, args.seeds, tuning, args.jobs)))
    else:
        print(format_table(table(args.scale, names, args.seed, tuning)))
    print(f"({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
