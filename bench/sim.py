"""The learner on every model origin, simulated (no sockets, no sleeping).

    python bench/sim.py                  # the long version of every scenario
    python bench/sim.py --scale 0.3 --only site-wide,mixed
"""

from __future__ import annotations

import argparse
import time

from scrapy_exitlimit.sim import format_table, table


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=1.0, help="pages, as a share of the long run")
    ap.add_argument("--only", default="", help="comma-separated scenario names")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    started = time.perf_counter()
    rows = table(args.scale, [n for n in args.only.split(",") if n], args.seed)
    print(format_table(rows))
    print(f"({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
