"""The core's CPU per request, alone: one admission, one clean answer, one release.

A fake clock and no sockets: ``Limiter.try_admit``, ``success`` and ``release`` on the
memory backend's core, 10 exits (``--exits``), learned mode, no limit (the clock steps
5 ms a request, one fewer in flight than exits), the process marked CPU-bound as in a
no-limit crawl. Prints microseconds per cycle (the fastest of ``--rounds``, and the
median) and how many were admitted: the same count before and after a change that keeps
every decision.

To compare two checkouts, alternate them, each with its own code first on the path::

    for i in 1 2 3; do for d in /tmp/old .; do
        PYTHONPATH=$d python bench/core_cycle.py; done; done
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections import deque

from scrapy_exitlimit.core.exits import Exit
from scrapy_exitlimit.core.limiter import Limiter, Tuning
from scrapy_exitlimit.core.limits import CRAWL_TUNING, Limits

ORIGIN = "http://origin.test"


def cycle(requests: int, exits: int, in_flight: int, step: float, latency: float
          ) -> tuple[float, int]:
    """(seconds per request, requests admitted): the loop's own time, on a fake clock
    (nothing in it waits)."""
    now = [0.0]
    pool = [Exit(f"e{i}", f"http://127.0.0.{10 + i}:8000") for i in range(exits)]
    limiter = Limiter(pool, Limits(rate=None, concurrency=8), clock=lambda: now[0],
                      tuning=Tuning(**CRAWL_TUNING), rng=random.Random(1))
    limiter.cpu_bound(True)
    out: deque = deque()
    admitted = 0
    started = time.perf_counter()
    for _ in range(requests):
        now[0] += step
        while out and (len(out) >= in_flight or now[0] - out[0].admitted_at > latency):
            lease = out.popleft()
            limiter.success(lease, now[0] - lease.admitted_at)
            limiter.release(lease.id)
        got = limiter.try_admit(ORIGIN)
        if not isinstance(got, float):
            out.append(got)
            admitted += 1
    return (time.perf_counter() - started) / requests, admitted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--exits", type=int, default=10, help="up to 64: the scan's pool sizes")
    args = ap.parse_args()
    times, admitted = [], 0
    for _ in range(args.rounds):
        seconds, admitted = cycle(args.requests, exits=args.exits,
                                  in_flight=args.exits - 1, step=0.005, latency=0.05)
        times.append(seconds * 1e6)
    print(f"{min(times):.1f} us per request (fastest of {args.rounds}; median "
          f"{statistics.median(times):.1f}), {admitted} of {args.requests} admitted")


if __name__ == "__main__":
    main()
