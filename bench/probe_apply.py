"""Benchmark: does the probe's suggestion, applied, beat the default?

    python bench/probe_apply.py                   # exits that carry 24, 24, 4, 4 at once
    python bench/probe_apply.py --capacity 4,4,4,4 --pages 600

Starts the lab in its own process: no rate limit, every body takes ``--body-time`` to
send, and exit i forwards at most ``capacity[i]`` requests at once (the rest queue at
the proxy), so the exits' capacity is the bottleneck. Runs ``scrapy exitlimit-probe``
against it, then crawls the same pages with the default settings and with the probe's
``EXITLIMIT_EXIT_SETTINGS``, alternating, ``--repeat`` times each, both at a known high
``EXITLIMIT_RATE`` (``--rate 0``: learned, which on an unlimited origin first has to
climb); prints pages/s (first request to last outcome) and the ratio suggested / default
of the medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from scrapy_exitlimit.lab.process import start_lab_process

SCRAPY = str(Path(sys.executable).parent / "scrapy")
FIRST_EXIT_HOST = 10


def start_lab(args: argparse.Namespace) -> tuple[subprocess.Popen, dict]:
    caps = [int(c) for c in args.capacity.split(",")]
    return start_lab_process(
        "--exits", str(len(caps)), "--rate", "0", "--body-time", str(args.body_time),
        "--proxy-capacity", *[f"127.0.0.{FIRST_EXIT_HOST + i}={c}" for i, c in enumerate(caps)])


def probe(lab: dict, args: argparse.Namespace) -> tuple[dict, str]:
    run = subprocess.run(
        [SCRAPY, "exitlimit-probe", lab["origin_url"] + "/page/0", "--exits",
         ",".join(lab["exit_urls"]), "--levels", args.levels, "-L", "WARNING"],
        capture_output=True, text=True, check=True, cwd="/tmp")
    out = run.stdout
    namespace: dict = {}
    exec(out[out.index("EXITLIMIT_EXIT_SETTINGS = {"):], namespace)  # the text to paste
    return namespace["EXITLIMIT_EXIT_SETTINGS"], out


def crawl(lab: dict, pages: int, first: int, exit_settings: dict | None,
          rate: float | None) -> dict:
    cmd = [sys.executable, "-m", "scrapy_exitlimit.lab.crawl", "--origin", lab["origin_url"],
           "--exits", ",".join(lab["exit_urls"]), "--pages", str(pages), "--first", str(first)]
    if rate:
        cmd += ["--set", f"EXITLIMIT_RATE={rate:g}"]
    if exit_settings:
        cmd += ["--set", "EXITLIMIT_EXIT_SETTINGS=" + json.dumps(exit_settings)]
    run = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(run.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capacity", default="24,24,4,4", help="per exit, comma-separated")
    ap.add_argument("--body-time", type=float, default=0.2)
    ap.add_argument("--levels", default="1,2,4,8,16,32,64")
    ap.add_argument("--pages", type=int, default=1500)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--rate", type=float, default=1000.0,
                    help="EXITLIMIT_RATE of both crawls (high: the exits' capacity is the "
                         "bottleneck, not the pair rate); 0: learned, as by default")
    args = ap.parse_args()
    lab, info = start_lab(args)
    try:
        suggested, out = probe(info, args)
        print(out)
        rates: dict[str, list[float]] = {"default": [], "suggested": []}
        first = 0
        for _ in range(args.repeat):
            for name, settings in (("default", None), ("suggested", suggested)):
                result = crawl(info, args.pages, first, settings, args.rate)
                first += args.pages  # fresh pages each time: nothing cached anywhere
                rate = result["ok"] / result["crawl_seconds"]
                rates[name].append(rate)
                print(f"{name:>9}: {result['ok']}/{args.pages} pages in "
                      f"{result['crawl_seconds']:.2f} s = {rate:.1f} pages/s, "
                      f"{len(result['failed'])} failed", flush=True)
    finally:
        lab.terminate()
        lab.wait()
    default, applied = (statistics.median(rates[k]) for k in ("default", "suggested"))
    rate = f"EXITLIMIT_RATE {args.rate:g}" if args.rate else "learned rate"
    print(f"\ncapacity {args.capacity}, body {args.body_time:g} s, {rate}, {args.pages} pages, "
          f"median of {args.repeat}: default {default:.1f} pages/s, suggested {applied:.1f} "
          f"pages/s, ratio {applied / default:.2f}")


if __name__ == "__main__":
    main()
