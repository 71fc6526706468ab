"""One benchmark crawl in its own process (a fresh reactor): prints a JSON result line."""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys

from scrapy.crawler import CrawlerProcess

from scrapy_exitlimit.lab.spider import PagesSpider


class RandomProxyMiddleware:
    """What most crawls do today: a random exit from the pool for every request."""

    def __init__(self, exits):
        self.exits = exits

    @classmethod
    def from_crawler(cls, crawler):
        return cls(crawler.settings.getlist("BENCH_EXITS"))

    def process_request(self, request, spider=None):
        request.meta["proxy"] = random.choice(self.exits)


def strategy_settings(name: str, exits: list[str], rate: float, redis_url: str = "") -> dict:
    random_proxy = {
        "BENCH_EXITS": exits,
        "DOWNLOADER_MIDDLEWARES": {__name__ + ".RandomProxyMiddleware": 740},
    }
    if name == "random-proxy":
        return random_proxy
    if name == "autothrottle":
        return {**random_proxy, "AUTOTHROTTLE_ENABLED": True}
    if name == "global-delay":
        return {**random_proxy, "DOWNLOAD_DELAY": 1.0 / rate, "DOWNLOAD_DELAY_JITTER": 0,
                "CONCURRENT_REQUESTS_PER_DOMAIN": 1}
    if name == "exitlimit":
        return {"ADDONS": {"scrapy_exitlimit.Addon": 100}, "EXITLIMIT_EXITS": exits,
                "EXITLIMIT_RATE": rate}
    if name == "exitlimit-high":
        return {"ADDONS": {"scrapy_exitlimit.Addon": 100}, "EXITLIMIT_EXITS": exits,
                "EXITLIMIT_RATE": 1000}
    if name == "exitlimit-learned":
        return {"ADDONS": {"scrapy_exitlimit.Addon": 100}, "EXITLIMIT_EXITS": exits}
    if name == "exitlimit-scope":  # every request an account's, its rate given
        return {"ADDONS": {"scrapy_exitlimit.Addon": 100}, "EXITLIMIT_EXITS": exits,
                "EXITLIMIT_SCOPES": {"acct-*": {"rate": rate}}}
    if name == "exitlimit-scope-learned":  # the same, the account's rate learned
        return {"ADDONS": {"scrapy_exitlimit.Addon": 100}, "EXITLIMIT_EXITS": exits}
    if name.startswith("exitlimit-pool"):  # N exits: gateway sessions over the lab's proxies
        size = int(name.removeprefix("exitlimit-pool"))
        templates = [u.replace("http://", "http://bench-{session}:pw@") for u in exits]
        return {"ADDONS": {"scrapy_exitlimit.Addon": 100}, "EXITLIMIT_EXITS": templates,
                "EXITLIMIT_SESSIONS": max(1, size // len(exits)), "EXITLIMIT_RATE": 1000,
                # the same crawl whatever the pool: only the exits differ
                "CONCURRENT_REQUESTS": 96}
    if name.startswith("exitlimit-redis"):  # the same, with state shared through Redis
        base = strategy_settings(name.replace("-redis", ""), exits, rate)
        return {**base, "EXITLIMIT_BACKEND": "redis", "EXITLIMIT_REDIS_URL": redis_url}
    raise SystemExit(f"unknown strategy {name!r}")


def _setting(value: str) -> tuple[str, object]:
    name, sep, raw = value.partition("=")
    if not sep:
        raise SystemExit(f"--set expects NAME=VALUE, got {value!r}")
    try:
        return name, json.loads(raw)
    except ValueError:
        return name, raw


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--strategy", required=True)
    ap.add_argument("--origin", required=True,
                    help="origin URL; comma-separated for a broad crawl (pages interleaved)")
    ap.add_argument("--exits", required=True, help="comma-separated proxy URLs")
    ap.add_argument("--rate", type=float, default=5.0)
    ap.add_argument("--pages", type=int, default=500)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--first", type=int, default=0, help="number of the first page")
    ap.add_argument("--redis", default="", help="Redis URL for the exitlimit-redis* strategies")
    ap.add_argument("--concurrent-items", type=int, default=0,
                    help="CONCURRENT_ITEMS (Scrapy starts that many tasks per response)")
    ap.add_argument("--state-file", default="", help="EXITLIMIT_STATE_FILE (a warm start)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a Scrapy setting over the strategy's (VALUE parsed as JSON when it is)")
    args = ap.parse_args()
    exits = args.exits.split(",")
    settings = {
        "LOG_LEVEL": __import__("os").environ.get("BENCH_LOG", "WARNING"),
        "TELNETCONSOLE_ENABLED": False,
        "ROBOTSTXT_OBEY": False,
        "CLOSESPIDER_TIMEOUT": args.timeout,
        **({"CONCURRENT_ITEMS": args.concurrent_items} if args.concurrent_items else {}),
        **strategy_settings(args.strategy, exits, args.rate, args.redis),
        **({"EXITLIMIT_STATE_FILE": args.state_file} if args.state_file else {}),
        **dict(_setting(value) for value in args.set),
    }
    process = CrawlerProcess(settings)
    crawler = process.create_crawler(PagesSpider)
    account = "acct-1" if "-scope" in args.strategy else ""  # the lab's --account-rate
    process.crawl(crawler, bases=args.origin, pages=args.pages, first=args.first,
                  account=account)
    process.start()
    spider = crawler.spider
    stats = crawler.stats.get_stats()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    json.dump({
        "strategy": args.strategy,
        "pages": args.pages,
        "ok": len(spider.ok),
        "failed": len(spider.failed),
        # first request to last outcome (Scrapy may notice the end up to 5 s later)
        "wall": spider.crawl_seconds,
        "crawl_cpu": spider.crawl_cpu_seconds,  # CPU over the same span
        "finish_reason": stats.get("finish_reason"),
        "requests": stats.get("downloader/request_count", 0),
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "max_rss_mb": usage.ru_maxrss / 1024,
        "exitlimit": {k: v for k, v in stats.items() if k.startswith("exitlimit/")},
    }, sys.stdout)
    print()


if __name__ == "__main__":
    main()
