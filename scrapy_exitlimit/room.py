"""Scrapy's downloader held to what is in flight, and a little room, while the CPU is full.

Parked requests count against CONCURRENT_REQUESTS, which the add-on sizes to the pool's
capacity plus room for them (``addon.pool_capacity``): a paced crawl needs requests at
hand when tokens come due. While this process is CPU-bound, a parked request gains
nothing: the exits wait for the event loop, not the other way round. It costs, though:
each one keeps its request, its middleware chain's coroutines and Deferreds alive, and
every collection of the garbage collector walks them (lab, no limit, 10 exits: ~86 parked
beside ~6 in flight; held to in flight + 16, the collector's time a crawl 0.56 -> 0.40 s,
wall 7.25 -> 6.8 s, 11.64 -> 11.30 M instructions a page under valgrind). So while the
CPU is the limit, the downloader holds what it has past this middleware and
``BUSY_ROOM`` (EXITLIMIT_BUSY_ROOM) more for each queue with requests parked (an origin,
a pinned exit, a set of scopes): each queue admits apart, and a broad crawl's origins
need requests at hand when their own tokens come due (30 origins held to 16 in all: 0.88
of the pool, 0.96 unnarrowed). The rest wait in Scrapy's scheduler, where a request
costs nothing. Once the CPU has room again, CONCURRENT_REQUESTS holds again.
"""

from __future__ import annotations

import logging
from typing import Any

from ._compat import downloader_total, set_downloader_total
from .core.health import BUSY_ROOM, narrowed_total

logger = logging.getLogger(__name__)


class DownloaderRoom:
    """Applies ``narrowed_total`` to a crawler's downloader, counting each narrowing
    (``room``: EXITLIMIT_BUSY_ROOM; 0 leaves the downloader alone)."""

    def __init__(self, crawler: Any, room: int = BUSY_ROOM) -> None:
        self.crawler = crawler
        self.room = room
        self.configured: int | None = None  # CONCURRENT_REQUESTS as the downloader had it
        self.narrowings = 0

    def update(self, busy: bool, parked: int, queues: int = 1) -> None:
        """After a reading of the CPU: ``busy`` or not, ``parked`` requests here now, in
        ``queues`` queues (each gets the room: see the module docstring)."""
        held_total = downloader_total(self.crawler) if self.room else None
        if held_total is None:
            return
        held, total = held_total
        if self.configured is None:
            if not busy:
                return  # nothing to change, and nothing read yet
            self.configured = total
        wanted = narrowed_total(self.configured, busy, held, parked, self.room, queues)
        if wanted == total:
            return
        if total == self.configured:
            self.narrowings += 1
            logger.debug("exitlimit: CPU-bound: the downloader holds %d requests (%d "
                         "parked), not %d", wanted, parked, total)
        set_downloader_total(self.crawler, wanted)

    def restore(self) -> None:
        """CONCURRENT_REQUESTS again (the crawl is ending)."""
        held_total = downloader_total(self.crawler)
        if self.configured is not None and held_total is not None \
                and held_total[1] != self.configured:
            set_downloader_total(self.crawler, self.configured)
