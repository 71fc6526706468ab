"""A progress line every LOGSTATS_INTERVAL, like Scrapy's LogStats, for the exit pool::

    exitlimit: exits 8 ready, 1 cooling, 0 banned, 1 dead; admitted 1200/min, 429 3/min, parked 14

With named scopes (counted, never listed: they may be many), and an origin paced as a
whole (with several: ``origin rates 3, slowest 2.5 r/s``), it goes on::

    exitlimit: exits 10 ready, ...; parked 3; scopes 40, slowest 1.9 r/s; origin rate 19.6 r/s

Enable with ``EXTENSIONS = {"scrapy_exitlimit.progress.ExitLimitProgress": 500}``. It
asks ``crawler.exitlimit.snapshot()`` (the middleware sets ``crawler.exitlimit``) for
a :class:`Snapshot`; without that attribute it stays quiet.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import NotConfigured

from ._compat import looping_call
from .config import read_bool

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Snapshot:
    """The pool right now: exits by state, running totals since the crawl began, and the
    rates wider than a pair."""

    exits_ready: int = 0
    exits_cooling: int = 0  # every pair of the exit cooling down or breaker-open
    exits_banned: int = 0
    exits_dead: int = 0  # evicted after proxy faults
    admitted_total: int = 0
    rate_limited_total: int = 0  # 429 answers
    parked: int = 0  # requests waiting for admission now
    scopes: int = 0  # named scopes the limiter holds (used within the last hour)
    slowest_scope_rate: float | None = None  # None: no scope limited
    origins_paced: int = 0  # origins paced as a whole (a site rate, 503s)
    slowest_origin_rate: float | None = None


def format_progress(snap: Snapshot, prev: Snapshot | None, elapsed: float) -> str:
    """The progress line; per-minute rates from the totals' change since ``prev``
    (None: since zero) over ``elapsed`` seconds. Then, when there are any, the named
    scopes (how many, the slowest rate) and the origin-wide rate (one origin's, or how
    many origins and the slowest)."""
    if prev is None:
        prev = Snapshot()
    per_min = 60.0 / elapsed if elapsed > 0 else 0.0
    admitted = max(0, snap.admitted_total - prev.admitted_total) * per_min
    limited = max(0, snap.rate_limited_total - prev.rate_limited_total) * per_min
    line = (f"exitlimit: exits {snap.exits_ready} ready, {snap.exits_cooling} cooling, "
            f"{snap.exits_banned} banned, {snap.exits_dead} dead; "
            f"admitted {admitted:.0f}/min, 429 {limited:.0f}/min, parked {snap.parked}")
    if snap.scopes:
        scope_rate = snap.slowest_scope_rate
        line += f"; scopes {snap.scopes}, " + (
            "none limited" if scope_rate is None else f"slowest {_rate(scope_rate)} r/s")
    if snap.slowest_origin_rate is not None:
        origin_rate = _rate(snap.slowest_origin_rate)
        line += (f"; origin rate {origin_rate} r/s" if snap.origins_paced == 1
                 else f"; origin rates {snap.origins_paced}, slowest {origin_rate} r/s")
    return line


def _rate(rate: float) -> str:
    """Three significant digits, never an exponent (0.05, 1.94, 19.6, 250)."""
    return f"{rate:.3g}" if rate < 100 else f"{rate:.0f}"


class ExitLimitProgress:
    """Logs :func:`format_progress` every ``LOGSTATS_INTERVAL`` seconds."""

    def __init__(self, crawler: Crawler, interval: float,
                 clock: Any = time.monotonic) -> None:
        self.crawler = crawler
        self.interval = interval
        self.clock = clock
        self.task: Any = None
        self._prev: Snapshot | None = None
        self._prev_at = clock()

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ExitLimitProgress:
        settings = crawler.settings
        if not read_bool(settings, "EXITLIMIT_ENABLED", True):
            raise NotConfigured("EXITLIMIT_ENABLED is off")
        interval = settings.getfloat("LOGSTATS_INTERVAL")
        if not interval:
            raise NotConfigured("LOGSTATS_INTERVAL is 0")
        o = cls(crawler, interval)
        crawler.signals.connect(o._spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(o._spider_closed, signal=signals.spider_closed)
        return o

    def _spider_opened(self, spider: Any = None) -> None:
        self._prev, self._prev_at = None, self.clock()
        self.task = looping_call(self.log)
        self.task.start(self.interval, now=False)

    def _spider_closed(self, spider: Any = None, reason: str = "") -> None:
        if self.task is not None and self.task.running:
            self.task.stop()
        self.task = None

    def log(self) -> str | None:
        """Log one line (and return it); None when there is no pool to report on."""
        source = getattr(self.crawler, "exitlimit", None)
        if source is None:
            return None
        snap = source.snapshot()
        now = self.clock()
        line = format_progress(snap, self._prev, now - self._prev_at)
        self._prev, self._prev_at = snap, now
        logger.info("%s", line)
        return line
