"""Run real crawls against the lab from pytest-twisted tests."""

from __future__ import annotations

from typing import Any

import scrapy
from scrapy.utils.test import get_crawler

QUIET = {
    "LOG_LEVEL": "INFO",
    "TELNETCONSOLE_ENABLED": False,
    "ROBOTSTXT_OBEY": False,
    "ADDONS": {"scrapy_exitlimit.Addon": 100},
}


class PagesSpider(scrapy.Spider):
    """Fetches /page/0 .. /page/N-1 once each and records what came of every one."""

    name = "pages"

    def __init__(self, base: str, pages: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.base, self.pages = base, int(pages)
        self.ok: dict[str, int] = {}
        self.failed: dict[str, str] = {}

    async def start(self):
        for i in range(self.pages):
            yield scrapy.Request(f"{self.base}/page/{i}", callback=self.parse, errback=self.error)

    def parse(self, response):
        self.ok[response.url] = response.status
        yield {"url": response.url, "exit": response.meta.get("exitlimit_exit")}

    def error(self, failure):
        response = getattr(failure.value, "response", None)
        reason = f"HTTP {response.status}" if response is not None else repr(failure.value)
        self.failed[failure.request.url] = reason


async def crawl(settings: dict[str, Any], base: str, pages: int,
                spidercls: type[scrapy.Spider] = PagesSpider):
    crawler = get_crawler(spidercls, {**QUIET, **settings})
    await crawler.crawl(base=base, pages=pages)
    return crawler
