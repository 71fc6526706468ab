"""A spider for the lab's pages, shared by the tests, the demo and the benchmark."""

from __future__ import annotations

import time
from typing import Any

import scrapy


class PagesSpider(scrapy.Spider):
    """Fetches ``/page/first`` .. ``/page/first+N-1`` once each and records what came of
    every one (``first`` lets several processes crawl disjoint pages).

    ``ok`` maps each downloaded URL to its status and ``failed`` each failed one to the
    reason; ``ok_count`` counts the downloads. ``keep_urls=False`` (for long soak runs)
    only counts: ``ok`` stays empty, so the spider's own memory does not grow per page.
    ``crawl_seconds`` runs from the first request to the last outcome: a benchmark's clock,
    free of the seconds Scrapy may take to notice that the crawl is over;
    ``crawl_cpu_seconds`` is this process's CPU time over the same span.

    A broad crawl: ``bases`` (a list, or comma-separated) interleaves several origins, page
    ``first`` of every base, then page ``first+1`` of every base, ...; ``pages`` counts
    requests over all of them (``pages=3000`` over 30 bases is 100 pages each).

    ``account``: every request is that account's (the ``X-Account`` header the lab's
    ``--account-rate`` limits) and names it as its ``exitlimit_scope``.
    """

    name = "lab_pages"

    def __init__(self, base: str = "", pages: int | str = 0, first: int | str = 0,
                 keep_urls: bool | str = True, bases: str | list[str] = "",
                 account: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.account = account
        if isinstance(bases, str):
            bases = [b for b in bases.split(",") if b]
        self.bases = [b.rstrip("/") for b in bases] or [base.rstrip("/")]
        if not self.bases[0]:
            raise ValueError("PagesSpider needs base= or bases=")
        self.base, self.pages, self.first = self.bases[0], int(pages), int(first)
        # a -a keep_urls=false from the command line arrives as a string
        self.keep_urls = keep_urls if isinstance(keep_urls, bool) else \
            keep_urls.lower() not in ("0", "false", "no")
        self.ok_count = 0
        self.ok: dict[str, int] = {}
        self.failed: dict[str, str] = {}
        self._started = self._last = 0.0
        self._cpu_started = self._cpu_last = 0.0

    @property
    def crawl_seconds(self) -> float:
        return self._last - self._started

    @property
    def crawl_cpu_seconds(self) -> float:
        return self._cpu_last - self._cpu_started

    async def start(self):
        self._started = time.monotonic()
        self._cpu_started = time.process_time()
        n = len(self.bases)
        for k in range(self.pages):
            url = f"{self.bases[k % n]}/page/{self.first + k // n}"
            if self.account:
                yield scrapy.Request(url, callback=self.parse, errback=self.error,
                                     headers={"X-Account": self.account},
                                     meta={"exitlimit_scope": self.account})
            else:
                yield scrapy.Request(url, callback=self.parse, errback=self.error)

    def parse(self, response):
        self._last = time.monotonic()
        self._cpu_last = time.process_time()
        self.ok_count += 1
        if self.keep_urls:
            self.ok[response.url] = response.status
        yield {"url": response.url, "exit": response.meta.get("exitlimit_exit")}

    def error(self, failure):
        self._last = time.monotonic()
        self._cpu_last = time.process_time()
        # HttpError carries Scrapy's response; before Scrapy 2.15 a Twisted ResponseFailed
        # arrives unwrapped, and its ``response`` is Twisted's (no ``status``)
        response = getattr(failure.value, "response", None)
        reason = (f"HTTP {response.status}" if isinstance(response, scrapy.http.Response)
                  else repr(failure.value))
        self.failed[failure.request.url] = reason
