"""The learner on every model origin, simulated (no sockets, no sleeping).

    python bench/sim.py                  # the long version of every scenario
    python bench/sim.py --scale 0.3 --only site-wide,mixed
    python bench/sim.py --warm           # learned mode cold, then warm from what it learned
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import replace

from scrapy_exitlimit.sim import SCENARIOS, format_table, table
from scrapy_exitlimit.sim.crawl import Result, simulate


def warm_table(scale: float, names: list[str], seed: int) -> str:
    """Each scenario in learned mode twice: cold, then from the cold run's learned state
    (EXITLIMIT_STATE_FILE); the whole run and its first second."""
    lines = [f"{'scenario':16} {'run':5} {'429 %':>7} {'util':>6} {'1st s util':>10} "
             f"{'1st s 429':>9} {'3 s 429':>7}"]
    for sc in SCENARIOS:
        if names and sc.name not in names:
            continue
        crawl = replace(sc.build(scale), seed=seed)
        cold = simulate(crawl)
        warm = simulate(replace(sc.build(scale), seed=seed, learned=cold.learned))
        for run, r in (("cold", cold), ("warm", warm)):
            lines.append(f"{sc.name:16} {run:5} {100 * r.share_429:7.2f} "
                         f"{_util(sc, r):6.3f} {_first(sc, r, 1.0)[0]:10.3f} "
                         f"{_first(sc, r, 1.0)[1]:9d} {_first(sc, r, 3.0)[1]:7d}")
    return "\n".join(lines)


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
    args = ap.parse_args()
    started = time.perf_counter()
    names = [n for n in args.only.split(",") if n]
    if args.warm:
        print(warm_table(args.scale, names, args.seed))
    else:
        print(format_table(table(args.scale, names, args.seed)))
    print(f"({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
