"""Probe each exit's concurrency knee, to size ``EXITLIMIT_EXIT_SETTINGS``.

``scrapy exitlimit-probe URL --exits EXITS [--levels 1,2,4,8,16] [--requests-per-level N]``
walks each exit, one at a time, through rising concurrency levels, sending
requests to URL through Scrapy's own downloader (``meta['proxy']`` set,
``dont_exitlimit``), and records per level the median and p95 latency and the
errors (download errors and statuses >= 400).

The **knee** is the first level whose median latency exceeds twice the
lowest level's, or that saw errors; the exit is not pushed past it. The
**suggested concurrency** is how many requests the exit kept in service up
to its knee (levels with errors do not count), the best level's:

- a level still answered at about the unloaded latency (median at most
  ``FLAT_FACTOR`` x the base, the lowest median seen) sustained all of it;
- past that, requests were queueing somewhere, and by Little's law the exit
  kept ``level x base / median`` in service (rounded down: the base includes
  the way there and back, which queueing hides, so the estimate runs high).
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import scrapy
from scrapy.http import Response
from twisted.python.failure import Failure

from .core.exits import Exit

logger = logging.getLogger(__name__)

DEFAULT_LEVELS = (1, 2, 4, 8, 16)
DEFAULT_REQUESTS_PER_LEVEL = 20
MAX_LEVEL = 512
#: a level whose median latency is more than this many times the base is the knee
KNEE_FACTOR = 2.0
#: a level whose median latency is at most this many times the base did not queue
FLAT_FACTOR = 1.15
SLOT_PREFIX = "exitlimit-probe@"


@dataclass
class LevelResult:
    """What one exit did at one concurrency level."""

    exit_id: str
    level: int
    sent: int = 0
    #: latencies (s) of the successful answers, less the first ``level`` answers,
    #: which may have paid for opening connections
    latencies: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
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


@dataclass
class ExitVerdict:
    exit_id: str
    levels: list[LevelResult]
    knee: int | None  # the level, None: none up to the highest probed
    reason: str  # why that level is the knee
    suggested: int | None  # None: the exit failed at its lowest level
    sustained: dict[int, float] = field(default_factory=dict)  # per level


def is_knee(result: LevelResult, base: float | None, base_level: int = 1) -> str | None:
    """Why ``result`` is the knee (``base``: the median latency at ``base_level``), or None."""
    if result.error_count:
        kinds = ", ".join(f"{k} x{n}" for k, n in result.errors.most_common(3))
        return f"errors ({kinds})"
    median = result.median
    if median is None or base is None:
        return "no answer"
    if median > KNEE_FACTOR * base:
        return f"median {median / base:.1f}x the level-{base_level} median"
    return None


def analyze(exit_id: str, results: Sequence[LevelResult]) -> ExitVerdict:
    """The knee and the suggested concurrency of one exit from its levels, lowest first."""
    ordered = sorted(results, key=lambda r: r.level)
    if not ordered:
        return ExitVerdict(exit_id, [], None, "not probed", None)
    first = ordered[0]
    base = first.median if not first.error_count else None
    knee, reason = None, ""
    counted: list[LevelResult] = []
    for result in ordered:
        why = is_knee(result, base, first.level)
        if not result.error_count and result.median:
            counted.append(result)
        if why is not None:
            knee, reason = result.level, why
            break
    if base is None or not counted:
        return ExitVerdict(exit_id, ordered, knee, reason, None)
    unloaded = min(r.median for r in counted if r.median)
    sustained: dict[int, float] = {}
    for r in counted:
        assert r.median
        sustained[r.level] = (r.level if r.median <= FLAT_FACTOR * unloaded
                              else min(r.level, r.level * unloaded / r.median))
    # rounded down, with a little slack for a measurement just under a whole request
    suggested = max(1, max(math.floor(v + 0.1) for v in sustained.values()))
    return ExitVerdict(exit_id, ordered, knee, reason, suggested, sustained)


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def format_verdicts(verdicts: Sequence[ExitVerdict], url: str = "") -> str:
    """The table per exit and level, each exit's knee, and the settings to paste."""
    header = (f"{'exit':<32} {'level':>5} {'timed':>5} {'errors':>6} {'median s':>8} "
              f"{'p95 s':>7} {'x base':>6} {'sustained':>9}")
    lines = [f"exitlimit-probe {url}".rstrip(), "", header, "-" * len(header)]
    for v in verdicts:
        base = v.levels[0].median if v.levels else None
        for i, r in enumerate(v.levels):
            ratio = r.median / base if r.median is not None and base else None
            mark = "  <- knee" if r.level == v.knee else ""
            lines.append(
                f"{v.exit_id if i == 0 else '':<32} {r.level:>5} {len(r.latencies):>5} "
                f"{r.error_count:>6} {_s(r.median):>8} {_s(r.p95):>7} "
                f"{'-' if ratio is None else f'{ratio:.2f}':>6} "
                f"{'-' if r.level not in v.sustained else f'{v.sustained[r.level]:.1f}':>9}"
                f"{mark}")
        if v.knee is not None:
            verdict = f"knee at {v.knee}: {v.reason}"
        else:
            top = v.levels[-1].level if v.levels else 0
            verdict = f"no knee up to {top}: it may carry more"
        suggestion = (f"suggested concurrency {v.suggested}" if v.suggested is not None
                      else "no suggestion: it failed at its lowest level")
        lines.append(f"    -> {verdict}; {suggestion}")
    lines += ["", suggest_settings(verdicts)]
    return "\n".join(lines)


def suggest_settings(verdicts: Sequence[ExitVerdict]) -> str:
    """``EXITLIMIT_EXIT_SETTINGS = {...}`` for the exits that got a suggestion."""
    rows = [f'    "{v.exit_id}": {{"concurrency": {v.suggested}}},'
            for v in verdicts if v.suggested is not None]
    failed = [v.exit_id for v in verdicts if v.suggested is None]
    out = "EXITLIMIT_EXIT_SETTINGS = {\n" + "\n".join(rows) + ("\n" if rows else "") + "}"
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
    in flight, one exit and one level at a time; fills ``results`` (a list it is given)."""

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
        self._to_send = self._outstanding = 0

    async def start(self) -> Any:
        for request in self._next_level():
            yield request

    def _next_level(self) -> Iterator[scrapy.Request]:
        """Close the level that just finished; open the next (of this exit or the next)."""
        if self._current is not None:
            done = self._current
            self._exit_levels.append(done)
            self.results.append(done)
            logger.info("exitlimit-probe: %s level %d: median %s s, p95 %s s, %d error(s)",
                        done.exit_id, done.level, _s(done.median), _s(done.p95),
                        done.error_count)
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
        self._outstanding += 1
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
        if response.status >= 400:
            result.errors[f"HTTP {response.status}"] += 1
        elif result.answered > result.level:  # past the answers that opened connections
            latency = response.meta.get("download_latency")
            if latency is not None:
                result.latencies.append(latency)
        yield from self._after_answer()

    def _failed(self, failure: Failure) -> Iterator[scrapy.Request]:
        result = self._current
        assert result is not None
        result.answered += 1
        result.errors[type(failure.value).__name__] += 1
        yield from self._after_answer()

    def _after_answer(self) -> Iterator[scrapy.Request]:
        self._outstanding -= 1
        if self._to_send > 0:
            yield self._request()
        elif self._outstanding == 0:
            yield from self._next_level()
