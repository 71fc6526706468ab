"""Run real crawls against the lab from pytest-twisted tests."""

from __future__ import annotations

from typing import Any

import scrapy
from scrapy.utils.test import get_crawler

from scrapy_exitlimit.lab.spider import PagesSpider

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
