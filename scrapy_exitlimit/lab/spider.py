"""A spider for the lab's pages, shared by the tests, the demo and the benchmark."""

from __future__ import annotations

from typing import Any

import scrapy


class PagesSpider(scrapy.Spider):
    """Fetches ``/page/first`` .. ``/page/first+N-1`` once each and records what came of
    every one (``first`` lets several processes crawl disjoint pages)."""

    name = "lab_pages"

    def __init__(self, base: str, pages: int | str, first: int | str = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.base, self.pages, self.first = base.rstrip("/"), int(pages), int(first)
        self.ok: dict[str, int] = {}
        self.failed: dict[str, str] = {}

    async def start(self):
        for i in range(self.first, self.first + self.pages):
            yield scrapy.Request(f"{self.base}/page/{i}", callback=self.parse, errback=self.error)

    def parse(self, response):
        self.ok[response.url] = response.status
        yield {"url": response.url, "exit": response.meta.get("exitlimit_exit")}

    def error(self, failure):
        response = getattr(failure.value, "response", None)
        reason = f"HTTP {response.status}" if response is not None else repr(failure.value)
        self.failed[failure.request.url] = reason
