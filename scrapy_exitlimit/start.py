"""Reading a spider's start requests without holding up the event loop.

Requests parked in the admission queue count against ``CONCURRENT_REQUESTS``, so in
an exitlimit crawl Scrapy's downloader is full from its first loop turns on. Scrapy's
engine reads start requests one per loop turn while the downloader has room, but
with it full it reads the rest back to back without returning to the event loop:
3,000 start requests held it for 0.18 s, 20,000 for 1.2 s (the lab, no limit). Meanwhile
no answer is read and no pacing timer fires, so the first answers, the proofs that
learned mode waits for before it climbs, wait for the last start request to be read.

:class:`CooperativeStartMiddleware` passes the start requests through unchanged and in
order, but hands the event loop a turn whenever reading them (the spider's ``start()``,
the spider middlewares inside this one, and Scrapy scheduling each request) has run
for ``SLICE`` seconds without one. Scrapy still reads them all as early as before. While
the downloader has room, Scrapy gives the loop a turn before each read itself, and so
no turn is added then.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ._compat import sleep

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

__all__ = ["SLICE", "CooperativeStartMiddleware", "loop_turn"]

#: seconds start requests are read for before the event loop gets a turn: a pacing
#: timer fires at most about this late, and leases, one per loop turn, go out at most
#: this far apart (a slow-start step reached 10 exits over 50 ms at 5 ms slices; no
#: limit, the crawl's first second lacked 0.37-0.41 s of its later rate, 0.31-0.36 s at
#: 1 ms; ~180 turns for 3,000 start requests, a few ms in all)
SLICE = 0.001


def loop_turn() -> Awaitable[None]:
    """Something to await that resumes on the event loop's next turn, whichever loop
    drives Scrapy's coroutines (asyncio under the asyncio reactor, else Twisted's)."""
    return sleep(0)


class CooperativeStartMiddleware:
    """Spider middleware: start requests read in slices of ``SLICE`` seconds."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter,
                 pause: Callable[[], Awaitable[Any]] = loop_turn,
                 slice_seconds: float = SLICE,
                 reads_at_once: Callable[[], bool] = lambda: True) -> None:
        self.clock = clock
        self.pause = pause
        self.slice_seconds = slice_seconds
        #: whether Scrapy reads the next start request without a loop turn first
        self.reads_at_once = reads_at_once
        #: loop turns handed over so far (for tests and curious operators)
        self.pauses = 0

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> CooperativeStartMiddleware:
        def reads_at_once() -> bool:
            # the engine waits for a loop turn before its next read unless it needs to
            # back out (the downloader full): public API (``needs_backout``)
            engine = crawler.engine
            return engine is None or engine.needs_backout()

        return cls(reads_at_once=reads_at_once)

    async def process_start(self, start: AsyncIterator[Any]) -> AsyncIterator[Any]:
        began = self.clock()
        async for item_or_request in start:
            yield item_or_request
            # (asked for the next one: the engine has just decided whether to wait for a
            # loop turn first; the time since ``began`` includes its scheduling of this one)
            if not self.reads_at_once():
                began = self.clock()  # it did: a new slice
            elif self.clock() - began >= self.slice_seconds:
                self.pauses += 1
                await self.pause()
                began = self.clock()
