"""A demo crawl through the built-in lab, ending with the origin's own per-exit count.

    python -m scrapy_exitlimit.demo [--pages 300] [--exits 10] [--rate 5]

Starts the lab (an origin allowing each client IP ``--rate`` requests/s, and
``--exits`` proxies on 127.0.0.10, .11, ...), runs ``scrapy crawl lab`` in
example_project/ with the lab's proxies as EXITLIMIT_EXITS, then prints what
the origin saw from each exit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from .lab.process import start_lab_process


def find_example_project() -> Path:
    for base in (Path(__file__).resolve().parents[1], Path.cwd()):
        if (base / "example_project" / "scrapy.cfg").is_file():
            return base / "example_project"
    raise SystemExit("example_project/ not found: run this from the scrapy-exitlimit checkout")


def per_exit_table(info: dict[str, Any], stats: dict[str, Any], rate: float) -> str:
    rows = [f"{'exit (IP the origin saw)':<26} {'pages':>6} {'429s':>5} {'achieved r/s':>13} "
            f"{'limit':>6}"]
    rows.append("-" * len(rows[0]))
    total_ok = total_429 = 0
    for url in info["exit_urls"]:
        ip = info["exit_ips"][url]
        s = stats["ips"].get(ip, {"status": {}, "accepted": 0, "accepted_span": None})
        ok, rejected = s["status"].get("200", 0), s["status"].get("429", 0)
        span = s.get("accepted_span")
        achieved = (s["accepted"] - 1) / (span[1] - span[0]) if span and span[1] > span[0] else 0
        total_ok, total_429 = total_ok + ok, total_429 + rejected
        rows.append(f"{ip:<26} {ok:>6} {rejected:>5} {achieved:>13.2f} {rate:>6g}")
    rows.append("-" * len(rows[0]))
    rows.append(f"{'all exits':<26} {total_ok:>6} {total_429:>5}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scrapy_exitlimit.demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=300)
    ap.add_argument("--exits", type=int, default=10)
    ap.add_argument("--rate", type=float, default=5.0)
    args = ap.parse_args(argv)
    project = find_example_project()
    lab, info = start_lab_process("--exits", str(args.exits), "--rate", str(args.rate))
    try:
        print(f"lab: origin {info['origin_url']} allowing {args.rate:g} r/s per client IP, "
              f"{args.exits} exits", flush=True)
        crawl = subprocess.run(
            [sys.executable, "-m", "scrapy", "crawl", "lab",
             "-a", f"origin={info['origin_url']}", "-a", f"pages={args.pages}",
             "-s", f"EXITLIMIT_RATE={args.rate}", "-s", "LOG_LEVEL=INFO"],
            cwd=project, check=False,
            env={**os.environ, "EXITLIMIT_EXITS": ",".join(info["exit_urls"])},
        )
        with urllib.request.urlopen(info["origin_url"] + "/_lab/stats", timeout=10) as resp:
            stats = json.load(resp)
    finally:
        lab.terminate()
        lab.wait(10)
    print("\nWhat the origin saw, per exit:\n")
    print(per_exit_table(info, stats, args.rate))
    fetched = stats["totals"]["status"].get("200", 0)
    print(f"\n{fetched} of {args.pages} pages fetched, "
          f"{stats['totals']['status'].get('429', 0)} answered 429")
    return crawl.returncode or (0 if fetched == args.pages else 1)


if __name__ == "__main__":
    sys.exit(main())
