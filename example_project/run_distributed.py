"""The distributed example, all on this machine: one crawl, several `scrapy crawl` processes.

    python example_project/run_distributed.py [--processes 3] [--pages 300] [--exits 10] [--rate 5]

Starts the lab (an origin allowing each client IP ``--rate`` requests/s, and ``--exits``
proxies on 127.0.0.10, .11, ...), a throwaway redis-server, and ``--processes`` ×
``scrapy crawl lab_distributed`` in this directory with EXITLIMIT_REDIS_URL set (the
project's distributed mode). They share the page queue and the exits' limits through
Redis and stop by themselves once the queue is drained. Then it prints how many pages each
process scraped and what the origin saw per exit, and exits non-zero if a page was lost
or crawled twice.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from scrapy_exitlimit.demo import per_exit_table
from scrapy_exitlimit.lab.process import start_lab_process
from scrapy_exitlimit.lab.redis_server import RedisServer

PROJECT = Path(__file__).resolve().parent


def run(processes: int = 3, pages: int = 300, exits: int = 10, rate: float = 5.0,
        settings: Sequence[str] = (), timeout: float = 120.0, workdir: str | None = None,
        out: TextIO | None = None) -> dict[str, Any]:
    """Run the crawl; return what each process scraped and what the origin counted."""
    workdir = workdir or tempfile.mkdtemp(prefix="exitlimit-distributed-")

    def print_(*args: Any) -> None:
        print(*args, file=out or sys.stdout, flush=True)

    redis = RedisServer()  # before the lab: no redis-server, nothing to clean up
    lab, info = start_lab_process("--exits", str(exits), "--rate", str(rate))
    procs: list[subprocess.Popen] = []
    try:
        redis.start()
        print_(f"lab: origin {info['origin_url']} allowing {rate:g} r/s per client IP, "
               f"{exits} exits; redis {redis.url}")
        print_(f"{processes} x scrapy crawl lab_distributed, {pages} pages; logs and items "
               f"in {workdir}")
        env = {**os.environ, "EXITLIMIT_REDIS_URL": redis.url,
               "EXITLIMIT_EXITS": ",".join(info["exit_urls"])}
        for i in range(1, processes + 1):
            cmd = [sys.executable, "-m", "scrapy", "crawl", "lab_distributed",
                   "-a", f"origin={info['origin_url']}", "-a", f"pages={pages}",
                   "-s", f"EXITLIMIT_RATE={rate}", "-s", "LOG_LEVEL=INFO",
                   "-O", f"{workdir}/items-{i}.jsonl"]
            for setting in settings:
                cmd += ["-s", setting]
            with open(f"{workdir}/crawl-{i}.log", "wb") as log:
                procs.append(subprocess.Popen(cmd, cwd=PROJECT, env=env, stdout=log,
                                              stderr=subprocess.STDOUT))
        deadline = time.monotonic() + timeout
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.terminate()
                p.wait(10)
        with urllib.request.urlopen(info["origin_url"] + "/_lab/stats", timeout=10) as resp:
            stats = json.load(resp)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        redis.stop()
        lab.terminate()
        lab.wait(10)

    per_process: list[list[str]] = []
    concurrency: list[int | None] = []
    for i in range(1, processes + 1):
        try:
            with open(f"{workdir}/items-{i}.jsonl") as f:
                per_process.append([json.loads(line)["url"] for line in f if line.strip()])
        except FileNotFoundError:
            per_process.append([])
        with open(f"{workdir}/crawl-{i}.log", errors="replace") as f:
            found = re.search(r"taking up to CONCURRENT_REQUESTS=(\d+)", f.read())
        concurrency.append(int(found[1]) if found else None)
    seen = Counter(url for urls in per_process for url in urls)
    expected = {f"{info['origin_url']}/page/{n}" for n in range(pages)}
    result = {
        "pages": pages,
        "returncodes": [p.returncode for p in procs],
        "items": [len(urls) for urls in per_process],
        "concurrent_requests": concurrency,
        "total": sum(seen.values()),
        "lost": sorted(expected - set(seen)),
        "duplicated": sorted(url for url, n in seen.items() if n > 1),
        "unexpected": sorted(set(seen) - expected),
        "fetched": stats["totals"]["status"].get("200", 0),
        "rejected": stats["totals"]["status"].get("429", 0),
        "workdir": workdir,
    }

    print_("\nPages scraped, per process:\n")
    for i, n in enumerate(result["items"], 1):
        print_(f"  crawl {i}: {n:>6}   (CONCURRENT_REQUESTS {concurrency[i - 1]}, "
               f"exit code {result['returncodes'][i - 1]}, log crawl-{i}.log)")
    print_(f"  total:   {result['total']:>6}   of {pages} pages; {len(result['lost'])} lost, "
           f"{len(result['duplicated'])} crawled twice")
    print_("\nWhat the origin saw, per exit (all processes together):\n")
    print_(per_exit_table(info, stats, rate))
    print_(f"\n{result['fetched']} pages fetched, {result['rejected']} answered 429")
    return result


def ok(result: dict[str, Any]) -> bool:
    return (not result["lost"] and not result["duplicated"] and not result["unexpected"]
            and result["total"] == result["pages"] and not any(result["returncodes"]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python example_project/run_distributed.py",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--processes", type=int, default=3)
    ap.add_argument("--pages", type=int, default=300)
    ap.add_argument("--exits", type=int, default=10)
    ap.add_argument("--rate", type=float, default=5.0)
    ap.add_argument("--timeout", type=float, default=120.0,
                    help="seconds before the crawls are stopped (default 120)")
    ap.add_argument("-s", "--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a Scrapy setting for every crawl, e.g. -s MAX_IDLE_TIME_BEFORE_CLOSE=2")
    args = ap.parse_args(argv)
    result = run(args.processes, args.pages, args.exits, args.rate, args.set, args.timeout)
    if ok(result):
        return 0
    for what in ("lost", "duplicated", "unexpected"):
        if result[what]:
            more = " ..." if len(result[what]) > 20 else ""
            print(f"{what}: {' '.join(result[what][:20])}{more}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
