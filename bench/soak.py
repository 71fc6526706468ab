"""Soak: one long crawl with the add-on, watching the crawl process's memory.

    python bench/soak.py --pages 20000
    python bench/soak.py --pages 20000 --backend redis

Starts the lab in its own process (no per-IP limit by default), runs one crawl process
(``python -m scrapy_exitlimit.lab.crawl``) over ``--pages`` pages with a high
``EXITLIMIT_RATE``, and samples that process's resident memory (VmRSS in /proc) every
``--interval`` seconds, with the pages the origin has served so far. Reports the RSS once
warmed up (at ``--warmup`` of the pages), at the end, the growth in MB and per 1000 pages,
pages/s and lost pages; and the same growth over the second half only, which a leak
shows as much as the first while a one-time step does not: Scrapy moves the spider's
start requests into its scheduler (about 1 KB each) in one batch some time into the
crawl, and freed memory is rarely given back to the system, so that batch appears as a
step of ~1 MB per 1000 queued pages. Exits 1 when a page was lost or the crawl did not
finish.

What else grows per page, left out by default so the growth is the add-on's: the lab
spider's dict of downloaded URLs (``--keep-urls`` puts it back) and Scrapy's duplicate
filter, a set with one fingerprint per request (``--dupefilter`` puts it back).
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from scrapy_exitlimit.lab.process import start_lab_process

ROOT = Path(__file__).resolve().parent.parent
MB = 1024 * 1024


def rss_bytes(pid: int) -> int | None:
    """VmRSS of a live process, None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def served(origin: str) -> int | None:
    """Pages the origin has answered 200 so far (its own count)."""
    try:
        with urllib.request.urlopen(origin + "/_lab/stats", timeout=5) as resp:
            return json.loads(resp.read())["totals"]["status"].get("200", 0)
    except (OSError, ValueError):
        return None


def redis_dbsize(url: str) -> int | None:
    host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
    try:
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(b"DBSIZE\r\n")
            reply = s.recv(64)
        return int(reply[1:].split(b"\r\n", 1)[0])
    except (OSError, ValueError):
        return None


def crawl_command(args: argparse.Namespace, info: dict, redis_url: str | None) -> list[str]:
    settings = {
        "EXITLIMIT_RATE": args.exit_rate,
        "LOG_LEVEL": "WARNING",
        "CLOSESPIDER_TIMEOUT": args.timeout,
        "MEMUSAGE_ENABLED": False,
        **({} if args.dupefilter else {"DUPEFILTER_CLASS": "scrapy.dupefilters.BaseDupeFilter"}),
        **({"EXITLIMIT_BACKEND": "redis", "EXITLIMIT_REDIS_URL": redis_url} if redis_url else {}),
    }
    cmd = [sys.executable, "-m", "scrapy_exitlimit.lab.crawl", "--origin", info["origin_url"],
           "--exits", ",".join(info["exit_urls"]), "--pages", str(args.pages)]
    if not args.keep_urls:
        cmd.append("--count-only")
    for name, value in settings.items():
        cmd += ["--set", f"{name}={json.dumps(value) if not isinstance(value, str) else value}"]
    return cmd


def soak(args: argparse.Namespace) -> int:
    lab, info = start_lab_process("--exits", str(args.exits), "--rate", str(args.origin_rate),
                                  cwd=ROOT)
    redis = crawl = None
    try:
        if args.backend == "redis":
            from scrapy_exitlimit.lab.redis_server import RedisServer

            redis = RedisServer()
            redis.start()
        redis_url = redis.url if redis is not None else None
        crawl = subprocess.Popen(crawl_command(args, info, redis_url), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, cwd=ROOT)
        samples: list[tuple[float, int, int, int | None]] = []  # (t, pages, rss, redis rss)
        started = time.monotonic()
        deadline = started + args.timeout + 60
        while crawl.poll() is None and time.monotonic() < deadline:
            rss = rss_bytes(crawl.pid)
            pages = served(info["origin_url"])
            if rss is not None and pages is not None:
                redis_rss = rss_bytes(redis.proc.pid) if redis is not None else None
                samples.append((time.monotonic() - started, pages, rss, redis_rss))
                if args.verbose:
                    print(f"  {samples[-1][0]:6.1f}s {pages:>7} pages  RSS "
                          f"{rss / MB:7.1f} MB", file=sys.stderr)
            time.sleep(args.interval)
        if crawl.poll() is None:
            crawl.kill()
        stdout, stderr = crawl.communicate(timeout=60)
        dbsize = redis_dbsize(redis_url) if redis_url else None
    finally:
        if crawl is not None and crawl.poll() is None:  # interrupted
            crawl.kill()
            crawl.wait(10)
        lab.terminate()
        lab.wait(10)
        if redis is not None:
            redis.stop()
    if crawl.returncode != 0 or not stdout.strip():
        sys.stderr.write(stderr[-3000:])
        print(f"the crawl failed (exit status {crawl.returncode})")
        return 1
    result = json.loads(stdout.strip().splitlines()[-1])
    return report(args, result, samples, dbsize)


def report(args: argparse.Namespace, result: dict, samples: list, dbsize: int | None) -> int:
    pages = args.pages
    if not samples:
        print("no sample taken: the crawl ended within one interval; use more --pages")
        return 1
    warm = next((s for s in samples if s[1] >= args.warmup * pages), samples[0])
    end = samples[-1]
    growth = end[2] - warm[2]
    span = end[1] - warm[1]
    per_1000 = growth / span * 1000 if span > 0 else float("nan")
    half = next((s for s in samples if s[1] >= pages / 2), end)
    half_growth = end[2] - half[2]
    half_span = end[1] - half[1]
    half_per_1000 = half_growth / half_span * 1000 if half_span > 0 else float("nan")
    ok, failed = result["ok"], len(result["failed"])
    lost = pages - ok - failed
    wall = result["wall"] or float("nan")
    print(f"\nsoak: {pages} pages, {args.exits} exits, EXITLIMIT_RATE {args.exit_rate:g}, "
          f"backend {args.backend}, origin limit "
          f"{'none' if not args.origin_rate else f'{args.origin_rate:g} r/s per IP'}")
    print(f"spider {'keeps every URL' if args.keep_urls else 'counts only'}; duplicate filter "
          f"{'on' if args.dupefilter else 'off'}; {len(samples)} samples every "
          f"{args.interval:g}s\n")
    rows = [
        ("finish reason", result["finish_reason"]),
        ("pages ok / failed / lost", f"{ok} / {failed} / {lost}"),
        ("wall (spider open to close)", f"{wall:.1f} s"),
        ("pages/s", f"{ok / wall:.1f}"),
        (f"RSS warmed up ({args.warmup:.0%})", f"{warm[2] / MB:.1f} MB at {warm[1]} pages, "
                                               f"{warm[0]:.0f} s"),
        ("RSS at the end", f"{end[2] / MB:.1f} MB at {end[1]} pages, {end[0]:.0f} s"),
        ("RSS peak (sampled)", f"{max(s[2] for s in samples) / MB:.1f} MB"),
        ("growth after warm-up", f"{growth / MB:+.2f} MB"),
        ("growth per 1000 pages", f"{per_1000 / 1024:+.1f} KB"),
        ("2nd half: RSS at 50% / end", f"{half[2] / MB:.1f} / {end[2] / MB:.1f} MB "
                                      f"({half[1]} to {end[1]} pages)"),
        ("2nd half: growth per 1000 pages", f"{half_per_1000 / 1024:+.1f} KB"),
    ]
    if end[3] is not None and warm[3] is not None:
        rows.append(("redis-server RSS warm / end",
                     f"{warm[3] / MB:.1f} / {end[3] / MB:.1f} MB, {dbsize} keys at the end"))
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    if args.keep_urls:
        # a dict entry: the URL string (~80 B), the int, and the table slot (~100 B all told)
        print(f"\nof the growth, the spider's URL dict explains about "
              f"{span * 180 / MB:.1f} MB (~180 B per page)")
    if args.dupefilter:
        print(f"of the growth, the duplicate filter's fingerprints explain about "
              f"{span * 120 / MB:.1f} MB (~120 B per request)")
    stats = result["exitlimit"]
    print("\nexitlimit stats: " + ", ".join(
        f"{k.split('/', 1)[1]}={v:g}" if isinstance(v, float) else f"{k.split('/', 1)[1]}={v}"
        for k, v in sorted(stats.items()) if isinstance(v, (int, float))))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "args": vars(args), "result": result, "samples": samples,
            "warm": warm, "half": half, "end": end, "growth_bytes": growth,
            "growth_per_1000_pages_bytes": per_1000,
            "second_half_growth_per_1000_pages_bytes": half_per_1000, "lost": lost},
            indent=1, default=str))
    return 0 if lost == 0 and not failed and result["finish_reason"] == "finished" else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=20000)
    ap.add_argument("--exits", type=int, default=10)
    ap.add_argument("--backend", choices=("memory", "redis"), default="memory")
    ap.add_argument("--exit-rate", type=float, default=1000.0, help="EXITLIMIT_RATE")
    ap.add_argument("--origin-rate", type=float, default=0.0,
                    help="the lab's per-IP limit (default 0: none)")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    ap.add_argument("--warmup", type=float, default=0.1,
                    help="share of the pages after which the process counts as warmed up")
    ap.add_argument("--timeout", type=float, default=1800.0,
                    help="CLOSESPIDER_TIMEOUT of the crawl (a safety net)")
    ap.add_argument("--keep-urls", action="store_true",
                    help="let the spider keep every downloaded URL (it only counts by default)")
    ap.add_argument("--dupefilter", action="store_true",
                    help="keep Scrapy's duplicate filter (off by default)")
    ap.add_argument("--json", help="also write the samples and the result to this file")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every sample")
    args = ap.parse_args(argv)
    if args.pages < 1 or not 0 < args.warmup < 1 or args.interval <= 0:
        ap.error("need --pages >= 1, 0 < --warmup < 1, --interval > 0")
    return soak(args)


if __name__ == "__main__":
    sys.exit(main())
