"""Run real crawls against the lab from pytest-twisted tests."""

from __future__ import annotations

import time
from typing import Any

import scrapy
from packaging.version import Version
from scrapy.utils.test import get_crawler

from scrapy_exitlimit.lab import Lab
from scrapy_exitlimit.lab.spider import PagesSpider

#: Scrapy before 2.18 waits 0.1 s before every callback, so the requests a crawl yields from
#: its callbacks reach the parking lot in a trickle. Pacing then lets a rare 429 through
#: (re-issued, nothing lost): measured on 2.13.4, the two-process example draws one in about
#: half its runs, and none with that delay set to 0; on 2.18 and 2.19, none. Until pacing
#: holds there too, the tests that count zero 429s allow a few on these versions.
CALLBACK_DELAY = Version(scrapy.__version__) < Version("2.18")

QUIET = {
    "LOG_LEVEL": "INFO",
    "TELNETCONSOLE_ENABLED": False,
    "ROBOTSTXT_OBEY": False,
    "ADDONS": {"scrapy_exitlimit.Addon": 100},
}


async def crawl(settings: dict[str, Any], base: str, pages: int,
                spidercls: type[scrapy.Spider] = PagesSpider):
    crawler = get_crawler(spidercls, {**QUIET, **settings})
    await crawler.crawl(base=base, pages=pages)
    return crawler


async def crawl_lab(lab: Lab, settings: dict[str, Any], pages: int,
                    spidercls: type[scrapy.Spider] = PagesSpider):
    """Start the lab, crawl its pages through its exits, stop it; ``crawler.origin`` is
    the origin's URL (the lab's is gone once stopped)."""
    await lab.start()
    origin = lab.origin_url
    try:
        crawler = await crawl({"EXITLIMIT_EXITS": lab.exit_urls, **settings}, origin, pages,
                              spidercls)
    finally:
        await lab.stop()
    crawler.origin = origin
    return crawler


async def crawl_twice_at_once(lab: Lab, settings: dict[str, Any], pages: int,
                              spidercls: type[scrapy.Spider] = PagesSpider):
    """Two crawlers in this process on the started ``lab``'s exits, each half of ``pages``
    (disjoint); returns both and the seconds from their start to the last one's end."""
    settings = {**QUIET, "EXITLIMIT_EXITS": lab.exit_urls, **settings}
    a, b = get_crawler(spidercls, settings), get_crawler(spidercls, settings)
    half = pages // 2
    da = a.crawl(base=lab.origin_url, pages=half, first=0)
    db = b.crawl(base=lab.origin_url, pages=half, first=half)
    started = time.monotonic()
    await da
    await db
    return a, b, time.monotonic() - started


class FixedCpuLoad:
    """A CPU load that always (or never) reads as CPU-bound, at every answer."""

    def __init__(self, busy: bool) -> None:
        self.busy = busy

    def due(self, wall: float) -> bool:
        return True

    def sample(self, wall: float, cpu: float) -> bool:
        return self.busy


def cpu_reads_busy(monkeypatch: Any, busy: bool) -> None:
    """Middlewares made from now on read the process as CPU-bound (or never)."""
    monkeypatch.setattr("scrapy_exitlimit.middleware.CpuLoad", lambda: FixedCpuLoad(busy))
