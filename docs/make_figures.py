"""Draw the two report figures in docs/ from real crawls against the lab.

    python docs/make_figures.py            # docs/report-mixed.png, docs/report-1000.png
    python docs/make_figures.py 1000 --telemetry DIR [--replot]   # keep (or reuse) the files

mixed: 10 live exits at 5 r/s per IP (two of them limited to 1 r/s, one banned with
403s) and one dead proxy, learned rates, 600 pages. 1000: 1,000 gateway sessions, 100
on each of 10 proxies (9 live, so the origin sees 9 IPs, and one dead), one proxy's IP
banned, 0.25 r/s per session, 30 r/s per IP, 2,000 pages. Each crawl takes a minute
or two on a busy 2-core machine; the telemetry files go to a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from scrapy_exitlimit import report  # noqa: E402
from scrapy_exitlimit.lab.process import start_lab_process  # noqa: E402


def lab(*args: str) -> tuple[subprocess.Popen, dict]:
    return start_lab_process(*args, stderr=None)


def crawl(info: dict, exits: list[str], pages: int, telemetry: Path, **settings: object
          ) -> dict:
    sets = [f"{k}={json.dumps(v)}" for k, v in {"EXITLIMIT_TELEMETRY": str(telemetry),
                                                **settings}.items()]
    out = subprocess.run(
        [sys.executable, "-m", "scrapy_exitlimit.lab.crawl", "--origin", info["origin_url"],
         "--exits", ",".join(exits), "--pages", str(pages),
         *[arg for s in sets for arg in ("--set", s)]],
        capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def mixed(tmp: Path, replot: bool = False) -> None:
    if replot:
        return draw_mixed(tmp / "mixed.jsonl")
    proc, info = lab("--exits", "10", "--rate", "5", "--slow", "127.0.0.18=1", "127.0.0.19=1",
                     "--ban", "127.0.0.17", "--dead", "1")
    try:
        telemetry = tmp / "mixed.jsonl"
        result = crawl(info, info["exit_urls"], 600, telemetry)
    finally:
        proc.terminate()
        proc.wait()
    print("mixed:", result["ok"], "pages ok")
    draw_mixed(telemetry)


def draw_mixed(telemetry: Path) -> None:
    records, _ = report.load(telemetry)
    report.plot(records, HERE / "report-mixed.png", title="mixed pool, learned rates: "
                "10 exits at 5 r/s per IP (2 limited to 1 r/s, 1 banned), 1 dead proxy")


def thousand(tmp: Path, replot: bool = False) -> None:
    if replot:
        return draw_thousand(tmp / "pool1000.jsonl")
    proc, info = lab("--exits", "9", "--rate", "30", "--ban", "127.0.0.12", "--dead", "1")
    try:
        ports = [url.rsplit(":", 1)[1] for url in info["exit_urls"]]
        exits = [f"http://s{i}-{{session}}:pw@127.0.0.1:{port}" for i, port in enumerate(ports)]
        telemetry = tmp / "pool1000.jsonl"
        result = crawl(info, exits, 2000, telemetry, EXITLIMIT_SESSIONS=100, EXITLIMIT_RATE=0.25,
                       EXITLIMIT_CONCURRENCY=2)
    finally:
        proc.terminate()
        proc.wait()
    print("1000:", result["ok"], "pages ok")
    draw_thousand(telemetry)


def draw_thousand(telemetry: Path) -> None:
    records, _ = report.load(telemetry)
    report.plot(records, HERE / "report-1000.png",
                title="1,000 exits (gateway sessions, 100 on each of 10 proxies, 0.25 r/s "
                "each, 30 r/s per IP): one IP banned, one proxy dead")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("which", nargs="*", choices=["mixed", "1000"], default=["mixed", "1000"])
    ap.add_argument("--telemetry", type=Path, default=None, help="keep telemetry files here")
    ap.add_argument("--replot", action="store_true", help="draw from the kept files")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        where = args.telemetry or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        if "mixed" in args.which:
            mixed(where, args.replot)
        if "1000" in args.which:
            thousand(where, args.replot)


if __name__ == "__main__":
    main()
