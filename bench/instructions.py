"""Instructions a page, counted: each strategy's crawl under valgrind, by difference.

On a noisy machine one crawl's CPU a page moves by 10-20 % run to run, more than the
5 % a must-show is about. valgrind counts the instructions the crawl process executes,
which do not move: each strategy crawls ``--pages`` and ``--pages x 4`` pages of one
lab (Scrapy's start-up and the lab's warm-up fall out of the difference) and prints the
difference per page, with data-cache misses (cachegrind's simulated L1) beside it.

The count is of what the crawl does under valgrind, 30-50 times slower than on the
machine: answers come back at once, so a learned crawl parks almost nothing, where a
real no-limit crawl parks nearly every request (CPU-bound, one request an exit). Give
the lab a latency (``--latency 1.5``) for a crawl that parks as the real one does; the
bare crawl is then bound by its 8 connections to the origin instead, so compare a
change against its own baseline there, not against bare. Each run says how many it
parked. ::

    python bench/instructions.py --strategies random-proxy,exitlimit-learned
    python bench/instructions.py --strategies exitlimit-learned --latency 1.5 \\
        --set CONCURRENT_REQUESTS=16

Two crawls a strategy, a few minutes each (``--pages 300``: 300 and 1,200 pages).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

from scrapy_exitlimit.lab.process import start_lab_process

CRAWL = str(Path(__file__).with_name("crawl_once.py"))


class Count(NamedTuple):
    """One crawl under cachegrind."""

    instructions: int
    misses: int  # L1 data
    result: dict  # crawl_once.py's result line


def counted(strategy: str, lab: dict, pages: int, sets: list[str]) -> Count:
    """One crawl of ``pages`` pages under cachegrind, counted."""
    cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=yes", "--cachegrind-out-file=/dev/null",
           sys.executable, CRAWL, "--strategy", strategy, "--origin", lab["origin_url"],
           "--exits", ",".join(lab["exit_urls"]), "--pages", str(pages), "--rate", "0",
           # fresh page numbers: the lab counts arrivals per page
           "--first", str(random.randrange(10**6, 10**9))]
    for value in sets:
        cmd += ["--set", value]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    refs = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    misses = re.search(r"D1\s+misses:\s+([\d,]+)", done.stderr)
    if done.returncode != 0 or refs is None or misses is None or not done.stdout.strip():
        raise SystemExit(f"{strategy}: the crawl under valgrind failed:\n{done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return Count(int(refs.group(1).replace(",", "")), int(misses.group(1).replace(",", "")),
                 result)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--strategies", default="random-proxy,exitlimit-learned",
                    help="comma-separated (bench/crawl_once.py's)")
    ap.add_argument("--pages", type=int, default=300,
                    help="the short crawl's pages; the long one crawls four times as many")
    ap.add_argument("--exits", type=int, default=10)
    ap.add_argument("--latency", type=float, default=0.0,
                    help="the lab origin's seconds before every answer")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a Scrapy setting for every crawl (crawl_once.py's --set)")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    lab_proc, lab = start_lab_process("--exits", str(args.exits), "--rate", "0",
                                      "--latency", str(args.latency))
    try:
        print(f"lab: {args.exits} exits, no limit, latency {args.latency:g} s; "
              f"{args.pages} and {args.pages * 4} pages a strategy", flush=True)
        for strategy in args.strategies.split(","):
            short = counted(strategy, lab, args.pages, args.set)
            long = counted(strategy, lab, args.pages * 4, args.set)
            pages = long.result["ok"] - short.result["ok"]
            if pages <= 0:
                raise SystemExit(f"{strategy}: the longer crawl fetched no more pages")
            parked = [c.result["exitlimit"].get("exitlimit/parked", 0) for c in (short, long)]
            print(f"{strategy}: "
                  f"{(long.instructions - short.instructions) / pages / 1e6:.3f} M instructions "
                  f"a page, {(long.misses - short.misses) / pages / 1e3:.1f} k L1 data misses a "
                  f"page (pages {short.result['ok']}, {long.result['ok']}; "
                  f"parked {parked[0]}, {parked[1]})", flush=True)
    finally:
        lab_proc.terminate()
        lab_proc.wait()


if __name__ == "__main__":
    main()
