"""One crawl of the lab's pages in its own process; prints one JSON line with the outcome.

Several of these at once, sharing state through Redis, are the multi-process
test and benchmark:

    python -m scrapy_exitlimit.lab.crawl --origin URL --exits URL,URL --pages 100 \\
        --first 0 --set EXITLIMIT_BACKEND=redis --set EXITLIMIT_REDIS_URL=redis://...
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from scrapy.crawler import CrawlerProcess

from .spider import PagesSpider


def _setting(value: str) -> tuple[str, Any]:
    name, sep, raw = value.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {value!r}")
    try:
        return name, json.loads(raw)
    except ValueError:
        return name, raw


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m scrapy_exitlimit.lab.crawl",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--origin", required=True)
    ap.add_argument("--exits", required=True, help="comma-separated proxy URLs")
    ap.add_argument("--pages", type=int, default=100)
    ap.add_argument("--first", type=int, default=0, help="number of the first page")
    ap.add_argument("--count-only", action="store_true",
                    help="count downloaded pages instead of keeping their URLs (soak runs)")
    ap.add_argument("--set", type=_setting, action="append", default=[], metavar="NAME=VALUE",
                    help="a Scrapy setting (VALUE parsed as JSON when it is JSON)")
    args = ap.parse_args(argv)
    settings = {
        "LOG_LEVEL": "WARNING",
        "TELNETCONSOLE_ENABLED": False,
        "ROBOTSTXT_OBEY": False,
        "ADDONS": {"scrapy_exitlimit.Addon": 100},
        "EXITLIMIT_EXITS": args.exits.split(","),
        **dict(args.set),
    }
    process = CrawlerProcess(settings)
    crawler = process.create_crawler(PagesSpider)
    process.crawl(crawler, base=args.origin, pages=args.pages, first=args.first,
                  keep_urls=not args.count_only)
    process.start()
    spider = crawler.spider
    stats = crawler.stats.get_stats()
    json.dump({
        "pages": args.pages,
        "ok": spider.ok_count,
        "failed": spider.failed,
        "wall": stats.get("elapsed_time_seconds"),
        "crawl_seconds": spider.crawl_seconds,  # first request to last outcome
        "finish_reason": stats.get("finish_reason"),
        "exitlimit": {k: v for k, v in stats.items() if k.startswith("exitlimit/")},
    }, sys.stdout, default=str)
    print()


if __name__ == "__main__":
    main()
