"""Probe each exit's capacity, to size ``EXITLIMIT_EXIT_SETTINGS``.

``scrapy exitlimit-probe URL --exits EXITS [--levels 1,2,4,8,16,32] [--requests-per-level N]``
walks each exit, one at a time, through rising concurrency levels, keeping exactly
``level`` requests to URL in flight through Scrapy's own downloader (``meta['proxy']``
set, ``dont_exitlimit``). Each request is timed until its body is complete (from the
moment it reaches the downloader to ``response_downloaded``; ``download_latency`` stops
at the response head, so a slow body would go unseen).

Per level it records the time of each clean answer (the first ``level`` answers, which
may have paid for opening connections, left out), the 429s and the errors, and the
**throughput** the exit kept up: ``mean in flight / mean time`` (Little's law), in flight
counted as each timed request reached the downloader: ``level`` while this machine keeps
up, fewer when it sends a refill late (a level that held fewer in flight than it says
would otherwise look faster than the exit can go).

Three things end an exit's walk, and they mean different things:

- **saturated** (the knee): a level raised the concurrency but not the throughput (it
  gained less than ``GAIN_SHARE`` of what the extra requests would add to an exit with
  room to spare), and its answers took ``QUEUED`` times as long as at the lowest level,
  and at least ``SLOW_FLOOR`` seconds: the extra requests only queued. The exit's
  capacity is reached. (Answers of a few milliseconds that stop speeding up show this
  machine's limit, not the exit's, and a higher cap costs nothing there: the floor keeps
  them from passing for a knee; an exit that answers unloaded within ``FAST_ANSWER``
  seconds and then stops speeding up is **machine-bound**, below.)
- **errors** (download errors, statuses >= 400 other than 429): the exit (or the target)
  refused the load; that level does not count.
- **rate-limited** (429s): the target's rate limit for the exit's address answered. That
  says how fast the target lets one address go, not how much the exit can carry: the
  walk stops (more would only draw more 429s) and the level does not count.

The **suggested concurrency**, for an exit that saturated or failed above its lowest
level, is how many requests it really kept in service by Little's law: its best
throughput x its unloaded time (the lowest median of its levels), rounded, at most the highest
level it carried. Past that, requests only queue: a cap there loses nothing and keeps
a crawl's late binding free to send them to an exit with room. An exit that never
saturated up to the highest level is suggested that level (it may carry more), and so
is a machine-bound one, or one that answered within ``FAST_ANSWER`` and then failed, the
highest level it carried (for answers that fast, Little's law measures this machine:
one process could not use the exit's capacity anyway, and a low cap would cost it). No
suggestion, so the default stays, for an exit rate-limited before it saturated (its
capacity is unknown: probe a URL that is not rate-limited), or one that failed at its
lowest level.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import scrapy
from scrapy import signals
from scrapy.http import Request, Response
from twisted.python.failure import Failure

from .core.exits import Exit

logger = logging.getLogger(__name__)

DEFAULT_LEVELS = (1, 2, 4, 8, 16, 32)
DEFAULT_REQUESTS_PER_LEVEL = 20
MAX_LEVEL = 512
#: a level that gains less than this share of the throughput its extra requests would add
#: to an exit with room to spare (doubling: x1.25) is saturated
GAIN_SHARE = 0.25
#: a saturated level's answers take at least this many times the lowest level's ...
QUEUED = 1.5
#: ... and at least this many seconds (below, a higher cap costs nothing)
SLOW_FLOOR = 0.05
#: an exit answering unloaded within this many seconds is faster than this machine
FAST_ANSWER = 0.01
SLOT_PREFIX = "exitlimit-probe@"
#: meta keys: when the request reached the downloader, and how long its whole answer took
STARTED_KEY = "_exitlimit_probe_started"
TIME_KEY = "exitlimit_probe_time"
#: how many of the probe's requests were in the downloader as this one reached it
LOAD_KEY = "_exitlimit_probe_load"


class Stop:
    """Why an exit's walk ended before its highest level."""

    SATURATED = "saturated"
    MACHINE = "machine-bound"
    ERRORS = "errors"
    RATE_LIMITED = "rate-limited"


@dataclass
class LevelResult:
    """What one exit did at one concurrency level."""

    exit_id: str
    level: int
    sent: int = 0
    #: whole-answer times (s) of the clean answers, less the first ``level`` answers,
    #: which may have paid for opening connections
    latencies: list[float] = field(default_factory=list)
    #: for each of those, how many requests were in flight as it reached the downloader
    #: (empty: ``level`` each)
    loads: list[int] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    rate_limited: int = 0  # 429 answers
    answered: int = 0

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    @property
    def median(self) -> float | None:
        return statistics.median(self.latencies) if self.latencies else None

    @property
    def p95(self) -> float | None:
        if not self.latencies:
            return None
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]

    @property
    def throughput(self) -> float | None:
        """Answers per second with as many in flight as there were (Little's law), None:
        no answer."""
        if not self.latencies:
            return None
        mean = statistics.fmean(self.latencies)
        load = statistics.fmean(self.loads) if self.loads else self.level
        return load / mean if mean > 0 else math.inf


@dataclass
class ExitVerdict:
    exit_id: str
    levels: list[LevelResult]
    knee: int | None  # the level that ended the walk, None: none up to the highest probed
    reason: str  # why that level ended it
    suggested: int | None  # None: keep the default (see ``stop``)
    throughput: dict[int, float] = field(default_factory=dict)  # per counted level
    stop: str | None = None  # a Stop value, None: walked every level


def _stop_at(result: LevelResult) -> tuple[str, str] | None:
    """(Stop, why) when ``result`` ends the walk on its own answers, else None."""
    if result.rate_limited:
        return Stop.RATE_LIMITED, (f"rate-limited ({result.rate_limited} x 429): the target's "
                                   "limit per address, not the exit's capacity")
    if result.error_count:
        kinds = ", ".join(f"{k} x{n}" for k, n in result.errors.most_common(3))
        return Stop.ERRORS, f"errors ({kinds})"
    if not result.latencies:
        return Stop.ERRORS, "no answer"
    return None


def analyze(exit_id: str, results: Sequence[LevelResult]) -> ExitVerdict:
    """The knee and the suggested concurrency of one exit from its levels, lowest first."""
    ordered = sorted(results, key=lambda r: r.level)
    if not ordered:
        return ExitVerdict(exit_id, [], None, "not probed", None)
    knee: int | None = None
    reason, stop = "", None
    counted: list[LevelResult] = []
    for result in ordered:
        ended = _stop_at(result)
        if ended is not None:
            knee, (stop, reason) = result.level, ended
            break
        rate = result.throughput
        assert rate is not None
        if counted:
            prev = counted[-1]
            best = max(r.throughput or 0.0 for r in counted)
            wanted = 1 + GAIN_SHARE * (result.level / prev.level - 1)
            counted.append(result)
            mean = statistics.fmean(result.latencies)
            unloaded = statistics.fmean(counted[0].latencies)
            if rate < wanted * best and mean >= max(QUEUED * unloaded, SLOW_FLOOR):
                knee, stop = result.level, Stop.SATURATED
                reason = (f"saturated: {rate:.1f}/s at {result.level} in flight, "
                          f"{rate / best:.2f}x the best below")
                if statistics.median(counted[0].latencies) < FAST_ANSWER:
                    stop = Stop.MACHINE
                    reason = (f"machine-bound: {rate:.1f}/s at {result.level} in flight, "
                              "answers too fast for the exit to be the limit")
                break
        else:
            counted.append(result)
    throughput = {r.level: r.throughput or 0.0 for r in counted}
    if not counted or (stop == Stop.RATE_LIMITED):
        return ExitVerdict(exit_id, ordered, knee, reason, None, throughput, stop)
    # answers this fast are judged as the walk judged them (machine-bound): by the lowest
    # level's median
    if stop is None or statistics.median(counted[0].latencies) < FAST_ANSWER:
        # it carried the highest level counted
        return ExitVerdict(exit_id, ordered, knee, reason, counted[-1].level, throughput, stop)
    # the median, and the lowest of the levels' (queueing only adds): one slow answer,
    # or a slow spell of this machine's during the lowest level, would inflate it
    unloaded = min(statistics.median(r.latencies) for r in counted)
    in_service = max(throughput.values()) * unloaded
    suggested = max(1, min(counted[-1].level, round(in_service)))
    return ExitVerdict(exit_id, ordered, knee, reason, suggested, throughput, stop)


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def format_verdicts(verdicts: Sequence[ExitVerdict], url: str = "") -> str:
    """The table per exit and level, each exit's knee, and the settings to paste."""
    header = (f"{'exit':<32} {'level':>5} {'timed':>5} {'429':>4} {'errors':>6} "
              f"{'median s':>8} {'p95 s':>7} {'answers/s':>9}")
    lines = [f"exitlimit-probe {url}".rstrip(),
             "(times: until the body is complete; answers/s: mean in flight / mean time)", "",
             header, "-" * len(header)]
    for v in verdicts:
        for i, r in enumerate(v.levels):
            mark = "  <- " + (v.stop or "knee") if r.level == v.knee else ""
            rate = r.throughput
            lines.append(
                f"{v.exit_id if i == 0 else '':<32} {r.level:>5} {len(r.latencies):>5} "
                f"{r.rate_limited:>4} {r.error_count:>6} {_s(r.median):>8} {_s(r.p95):>7} "
                f"{'-' if rate is None else f'{rate:.1f}':>9}{mark}")
        if v.knee is not None:
            verdict = f"stopped at {v.knee}: {v.reason}"
        else:
            top = v.levels[-1].level if v.levels else 0
            verdict = f"not saturated up to {top}: it may carry more"
        if v.suggested is not None:
            suggestion = f"suggested concurrency {v.suggested}"
        elif v.stop == Stop.RATE_LIMITED:
            suggestion = ("no suggestion: rate-limited before it saturated (probe a URL "
                          "without a rate limit); keep the default")
        else:
            suggestion = "no suggestion: it failed at its lowest level"
        lines.append(f"    -> {verdict}; {suggestion}")
    lines += ["", suggest_settings(verdicts)]
    return "\n".join(lines)


def suggest_settings(verdicts: Sequence[ExitVerdict]) -> str:
    """``EXITLIMIT_EXIT_SETTINGS = {...}`` for the exits that got a suggestion."""
    rows = [f'    "{v.exit_id}": {{"concurrency": {v.suggested}}},'
            for v in verdicts if v.suggested is not None]
    limited = [v.exit_id for v in verdicts if v.suggested is None and v.stop == Stop.RATE_LIMITED]
    failed = [v.exit_id for v in verdicts if v.suggested is None and v.stop != Stop.RATE_LIMITED]
    out = "EXITLIMIT_EXIT_SETTINGS = {\n" + "\n".join(rows) + ("\n" if rows else "") + "}"
    if limited:
        out += "\n# rate-limited before saturating (default kept): " + ", ".join(limited)
    if failed:
        out += "\n# no answer to size: " + ", ".join(failed)
    return out


def parse_levels(value: str) -> list[int]:
    """``"1,2,4,8"`` → ``[1, 2, 4, 8]``: distinct, ascending, each 1..MAX_LEVEL."""
    try:
        levels = sorted({int(x) for x in value.split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"--levels ({value!r}) must be comma-separated integers") from None
    if not levels or levels[0] < 1 or levels[-1] > MAX_LEVEL:
        raise ValueError(f"--levels ({value!r}) must be between 1 and {MAX_LEVEL}")
    return levels


class ProbeSpider(scrapy.Spider):
    """Sends ``max(requests_per_level, 2 x level)`` requests per level, exactly ``level``
    in flight, one exit and one level at a time; fills ``results`` (a list it is given).

    The next request of a level goes out as soon as one leaves the downloader (the
    ``request_left_downloader`` signal, through ``engine.crawl``), not from the callback:
    Scrapy before 2.18 waits 0.1 s before each callback, and a request sent from there
    would leave fewer than ``level`` in flight. Answers are counted in the callbacks; the
    next level starts once the last one is.
    """

    name = "exitlimit_probe"
    custom_settings = {
        # the spider itself keeps exactly `level` requests in flight
        "CONCURRENT_REQUESTS": MAX_LEVEL,
        "CONCURRENT_REQUESTS_PER_DOMAIN": MAX_LEVEL,
        "DOWNLOAD_DELAY": 0,
        "AUTOTHROTTLE_ENABLED": False,
        "RETRY_ENABLED": False,
        "REDIRECT_ENABLED": False,
        "HTTPCACHE_ENABLED": False,
        "ROBOTSTXT_OBEY": False,
        "COOKIES_ENABLED": False,
        "TELNETCONSOLE_ENABLED": False,
        "LOGSTATS_INTERVAL": 0,
    }

    def __init__(self, url: str, exits: Sequence[Exit], levels: Sequence[int],
                 requests_per_level: int, results: list[LevelResult], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.url = url
        self.exits = list(exits)
        self.levels = sorted(levels)
        self.requests_per_level = requests_per_level
        self.results = results
        self._exit_i, self._level_i = 0, -1
        self._current: LevelResult | None = None
        self._exit_levels: list[LevelResult] = []
        self._to_send = 0
        self._in_flight = 0  # requests between reaching the downloader and leaving it

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> ProbeSpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider._reached, signal=signals.request_reached_downloader)
        crawler.signals.connect(spider._downloaded, signal=signals.response_downloaded)
        crawler.signals.connect(spider._left, signal=signals.request_left_downloader)
        return spider

    def _reached(self, request: Request, spider: Any = None) -> None:
        self._in_flight += 1
        request.meta[STARTED_KEY] = time.monotonic()
        request.meta[LOAD_KEY] = self._in_flight

    @staticmethod
    def _downloaded(response: Response, request: Request, spider: Any = None) -> None:
        """The body is complete here (``download_latency`` stopped at the head)."""
        started = request.meta.get(STARTED_KEY)
        if started is not None:
            request.meta[TIME_KEY] = time.monotonic() - started

    def _left(self, request: Request, spider: Any = None) -> None:
        """One of ours left the downloader (answered or failed): keep the level full."""
        if STARTED_KEY not in request.meta:
            return
        self._in_flight -= 1
        if self._to_send > 0:
            self.crawler.engine.crawl(self._request())

    async def start(self) -> Any:
        for request in self._next_level():
            yield request

    def _next_level(self) -> Iterator[scrapy.Request]:
        """Close the level that just finished; open the next (of this exit or the next)."""
        if self._current is not None:
            done = self._current
            self._exit_levels.append(done)
            self.results.append(done)
            logger.info("exitlimit-probe: %s level %d: median %s s, p95 %s s, %d x 429, "
                        "%d error(s)", done.exit_id, done.level, _s(done.median),
                        _s(done.p95), done.rate_limited, done.error_count)
            verdict = analyze(done.exit_id, self._exit_levels)
            if verdict.knee is not None or self._level_i + 1 >= len(self.levels):
                self._exit_i, self._level_i, self._exit_levels = self._exit_i + 1, -1, []
        if self._exit_i >= len(self.exits):
            self._current = None
            return
        self._level_i += 1
        level = self.levels[self._level_i]
        exit_ = self.exits[self._exit_i]
        self._current = LevelResult(exit_.id, level)
        self._to_send = max(self.requests_per_level, 2 * level)
        for _ in range(level):
            yield self._request()

    def _request(self) -> scrapy.Request:
        assert self._current is not None
        exit_ = self.exits[self._exit_i]
        self._to_send -= 1
        self._current.sent += 1
        return scrapy.Request(
            self.url, callback=self._answer, errback=self._failed, dont_filter=True,
            meta={"proxy": exit_.url, "dont_exitlimit": True, "download_slot":
                  SLOT_PREFIX + exit_.id, "handle_httpstatus_all": True, "dont_retry": True,
                  "dont_redirect": True, "dont_cache": True})

    def _answer(self, response: Response) -> Iterator[scrapy.Request]:
        result = self._current
        assert result is not None
        result.answered += 1
        if response.status == 429:
            result.rate_limited += 1
        elif response.status >= 400:
            result.errors[f"HTTP {response.status}"] += 1
        elif result.answered > result.level:  # past the answers that opened connections
            latency = response.meta.get(TIME_KEY)
            if latency is not None:
                result.latencies.append(latency)
                result.loads.append(response.meta.get(LOAD_KEY, result.level))
        yield from self._after_answer()

    def _failed(self, failure: Failure) -> Iterator[scrapy.Request]:
        result = self._current
        assert result is not None
        result.answered += 1
        result.errors[type(failure.value).__name__] += 1
        yield from self._after_answer()

    def _after_answer(self) -> Iterator[scrapy.Request]:
        result = self._current
        assert result is not None
        if self._to_send == 0 and result.answered == result.sent:
            yield from self._next_level()
