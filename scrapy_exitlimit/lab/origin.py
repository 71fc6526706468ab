"""The lab origin: an HTTP server that rate-limits each client IP like nginx ``limit_req``.

Every decision is made on arrival with a GCRA per client IP (and optionally one for the
whole origin); every arrival is recorded so tests and the benchmark can check, after the
fact, how hard each exit really hit the origin.

A slow body, off by default: ``OriginConfig.body_time`` sends the head at once and the
body in pieces over that many seconds, as a big page on a slow link arrives (a client
timing the head alone sees none of it).

A limit that moves, off by default: ``OriginConfig.rate_schedule`` switches the per-IP rate
(of every IP without its own ``IPRule.rate``) at given seconds after the first request the
origin sees since its last reset, as an nginx reloaded with a new ``rate`` would.

A fault, off by default: the origin can *stall* chosen pages, or a fraction of page
requests: accept them and never answer (``OriginConfig.stall_paths`` / ``stall_fraction``).

Signals, each off by default: one answer at a chosen time (``OriginConfig.status_at``: the
single 503 of an overloaded backend, with its Retry-After); a ``RateLimit-Policy`` stated on
every answer whatever the limit really is (``announce_policy``, an honest or a false hint,
as nginx ``add_header ... always`` sends it); and a fixed-window limit per client IP
(``window_limit`` per ``window`` seconds, GitHub style) that states ``X-RateLimit-Limit``,
``-Remaining`` and ``-Reset`` with the reset in seconds or as a Unix time.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from email.utils import formatdate
from enum import Enum
from typing import Any

from twisted.internet.defer import Deferred, gatherResults
from twisted.web.http import HTTPChannel
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from ._net import ConnectionTracker, ListeningServer, reason_phrase

logger = logging.getLogger(__name__)

Clock = Callable[[], float]

# Float sums such as 0.2 * 3 must not reject a request that is exactly on time.
_EPS = 1e-9
_STATUSES = (200, 429, 403, 503, 404)
_MODES = ("seconds", "http-date", "none")
_RESET_FORMS = ("seconds", "epoch")
_HTML = b"text/html; charset=utf-8"
#: pieces a slow body (OriginConfig.body_time) is sent in
BODY_PIECES = 4


class _Inherit(Enum):
    INHERIT = "inherit"

    def __repr__(self) -> str:
        return "INHERIT"


INHERIT = _Inherit.INHERIT
"""Sentinel for :attr:`IPRule.rate`: use :attr:`OriginConfig.rate`."""


@dataclass
class IPRule:
    """Per-client-IP overrides."""

    rate: float | None | _Inherit = INHERIT  # None: unlimited for this IP
    ban: bool = False  # 403 block page for everything
    latency: float = 0.0  # added to OriginConfig.latency
    capacity: int | None | _Inherit = INHERIT  # None: unbounded for this IP


@dataclass(frozen=True)
class ScheduledAnswer:
    """One page request answered ``status`` instead of being served: the first to arrive
    ``at`` seconds or more after the first request since the last reset (as a rate
    schedule counts), with ``Retry-After: retry_after`` seconds when given. It is decided
    before the limiters and consumes nothing from them."""

    at: float
    status: int
    retry_after: float | None = None

    def __post_init__(self) -> None:
        if self.at < 0 or not 100 <= self.status <= 599:
            raise ValueError("a scheduled answer needs at >= 0 and a status in 100..599")
        if self.retry_after is not None and self.retry_after < 0:
            raise ValueError("a scheduled answer's retry_after must be >= 0")


@dataclass
class OriginConfig:
    rate: float | None = 5.0  # accepted requests/s per client IP; None: unlimited
    burst: int = 1
    retry_after: float = 1.0  # seconds advertised on 429 / origin_status
    retry_after_mode: str = "seconds"  # "seconds" | "http-date" | "none"
    origin_rate: float | None = None  # whole-origin limit, checked after the per-IP one
    origin_burst: int = 1
    origin_status: int = 503
    latency: float = 0.0  # seconds before every answer
    # seconds from the head to the last byte of the body, sent in BODY_PIECES pieces
    # (an answer in service, see capacity, stays in service until its body is sent)
    body_time: float = 0.0
    per_ip: dict[str, IPRule] = field(default_factory=dict)
    ratelimit_headers: bool = False
    # answers in service at once per client IP (each takes its latency); the rest queue
    # FIFO, so latency grows with concurrency past it. None: unbounded
    capacity: int | None = None
    # Fault: page requests accepted and never answered (the client must time out). Paths
    # as requested, e.g. {"/page/3"}; each stalls its first ``stall_times`` arrivals, then
    # is served (None: stalls forever). ``stall_fraction`` stalls any page request with that
    # probability, drawn from random.Random(stall_seed). A stall is decided before the
    # limiters (it consumes nothing) and is recorded in ``Origin.stalled()``, not as an arrival.
    stall_paths: Iterable[str] = ()
    stall_times: int | None = None
    stall_fraction: float = 0.0
    stall_seed: int | None = None
    # ``[(at, rate), ...]``: from ``at`` seconds after the first request since the last reset,
    # IPs that inherit ``rate`` are limited to this rate instead (their GCRA keeps the slot it
    # already booked). Before the first ``at``, ``rate`` holds.
    rate_schedule: Iterable[tuple[float, float]] = ()
    # One-off answers at chosen times since the first request (e.g. a single 503 with
    # Retry-After 3, 10 s in), each given once per reset.
    status_at: Iterable[ScheduledAnswer] = ()
    # A RateLimit-Policy field value (e.g. "10;w=1") sent as is on every answer, whatever
    # the limits really are; it replaces the one ratelimit_headers would derive.
    announce_policy: str | None = None
    # A fixed-window limit per client IP, checked after the per-IP rate: window_limit
    # requests per `window` seconds, a window opening with an IP's first request after the
    # last one closed. Every page answer states X-RateLimit-Limit/-Remaining/-Reset, the
    # reset as seconds to the window's end ("seconds") or its end in Unix time ("epoch");
    # a request over it is answered 429 with Retry-After the seconds to the window's end.
    window_limit: int | None = None
    window: float = 60.0
    window_reset: str = "seconds"

    def __post_init__(self) -> None:
        self.stall_paths = frozenset(self.stall_paths)  # a one-shot iterator is read once
        self.status_at = sorted(self.status_at, key=lambda a: a.at)
        if self.announce_policy is not None and (
                not self.announce_policy.isprintable() or not self.announce_policy.isascii()):
            raise ValueError("announce_policy must be printable ASCII")
        if self.window_limit is not None and (self.window_limit < 1 or self.window <= 0):
            raise ValueError("a fixed window needs window_limit >= 1 and window > 0")
        if self.window_reset not in _RESET_FORMS:
            raise ValueError(f"window_reset must be one of {_RESET_FORMS}")
        if self.window_limit is not None and self.ratelimit_headers:
            raise ValueError("ratelimit_headers states the per-IP rate; a fixed window "
                             "states its own X-RateLimit-* headers: choose one")
        self.rate_schedule = sorted((float(at), float(r)) for at, r in self.rate_schedule)
        if any(at < 0 or r <= 0 for at, r in self.rate_schedule):
            raise ValueError("rate_schedule needs times >= 0 and rates > 0")
        if not 0.0 <= self.stall_fraction <= 1.0:
            raise ValueError("stall_fraction must be in [0, 1]")
        if self.stall_times is not None and self.stall_times < 1:
            raise ValueError("stall_times must be >= 1 (None means always)")
        if self.body_time < 0:
            raise ValueError("body_time must be >= 0")
        if self.retry_after_mode not in _MODES:
            raise ValueError(f"retry_after_mode must be one of {_MODES}")
        rates = [self.rate, self.origin_rate] + [r.rate for r in self.per_ip.values()]
        if any(isinstance(r, (int, float)) and r <= 0 for r in rates):
            raise ValueError("rates must be > 0 (None means unlimited)")
        if self.burst < 1 or self.origin_burst < 1:
            raise ValueError("bursts must be >= 1")
        capacities = [self.capacity] + [r.capacity for r in self.per_ip.values()]
        if any(isinstance(c, int) and c < 1 for c in capacities):
            raise ValueError("capacities must be >= 1 (None means unbounded)")

    def rate_for(self, ip: str) -> float | None:
        rule = self.per_ip.get(ip)
        if rule is None or rule.rate is INHERIT:
            return self.rate
        return rule.rate

    def inherits_rate(self, ip: str) -> bool:
        rule = self.per_ip.get(ip)
        return rule is None or rule.rate is INHERIT

    def scheduled_rate(self, elapsed: float) -> float | None:
        """The per-IP rate ``elapsed`` seconds after the schedule started."""
        rate = self.rate
        for at, scheduled in self.rate_schedule:
            if elapsed + _EPS >= at:
                rate = scheduled
        return rate

    def capacity_for(self, ip: str) -> int | None:
        rule = self.per_ip.get(ip)
        if rule is None or rule.capacity is INHERIT:
            return self.capacity
        return rule.capacity


class _Service:
    """One client IP's answers in service (at most ``capacity``) and those queued."""

    __slots__ = ("capacity", "busy", "queue")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.busy = 0
        self.queue: deque[_Job] = deque()


class _Job:
    __slots__ = ("request", "body", "delay", "body_time", "call", "gone")

    def __init__(self, request: Request, body: bytes, delay: float, body_time: float) -> None:
        self.request, self.body, self.delay, self.body_time = request, body, delay, body_time
        self.call: Any = None  # the pending answer (or its next piece), once in service
        self.gone = False  # answered, or the client hung up


class GCRA:
    """Generic cell rate algorithm, the arithmetic of nginx ``limit_req`` with ``nodelay``.

    Emission interval ``T = 1/rate``, tolerance ``tau = (burst - 1) * T``. A request at
    ``t`` is accepted iff ``t >= tat - tau``; then ``tat = max(tat, t) + T``. A rejected
    request leaves ``tat`` alone, so hammering does not push the next slot further out.
    """

    __slots__ = ("rate", "burst", "interval", "tau", "clock", "tat")

    def __init__(self, rate: float, burst: int = 1, clock: Clock = time.monotonic) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be > 0 and burst >= 1")
        self.rate = rate
        self.burst = burst
        self.interval = 1.0 / rate
        self.tau = (burst - 1) * self.interval
        self.clock = clock
        self.tat = 0.0

    def set_rate(self, rate: float) -> None:
        """A new rate from now on; the slot already booked (``tat``) stays booked."""
        if rate <= 0:
            raise ValueError("rate must be > 0")
        self.rate = rate
        self.interval = 1.0 / rate
        self.tau = (self.burst - 1) * self.interval

    def wait_time(self, now: float | None = None) -> float:
        """Seconds until a request would be accepted (0.0: now)."""
        now = self.clock() if now is None else now
        wait = self.tat - self.tau - now
        return wait if wait > _EPS else 0.0

    def try_acquire(self, now: float | None = None) -> bool:
        now = self.clock() if now is None else now
        if now < self.tat - self.tau - _EPS:
            return False
        self.tat = max(self.tat, now) + self.interval
        return True

    def remaining(self, now: float | None = None) -> int:
        """How many requests would be accepted back to back right now."""
        now = self.clock() if now is None else now
        slack = now - (self.tat - self.tau) + _EPS
        return 0 if slack < 0 else min(self.burst, int(slack / self.interval) + 1)

    def policy(self) -> tuple[int, int]:
        """``(limit, window)`` for the RateLimit headers: whole seconds to refill the burst."""
        window = max(1, math.ceil(self.burst / self.rate - _EPS))
        return max(1, round(self.rate * window)), window

    def reset(self) -> None:
        self.tat = 0.0


class FixedWindow:
    """``limit`` requests per ``window`` seconds, GitHub style: a window opens with the
    first request after the last one closed and counts what it accepts; a rejected
    request consumes nothing."""

    __slots__ = ("limit", "window", "start", "used")

    def __init__(self, limit: int, window: float) -> None:
        if limit < 1 or window <= 0:
            raise ValueError("limit must be >= 1 and window > 0")
        self.limit, self.window = limit, window
        self.start = -math.inf
        self.used = 0

    def _roll(self, now: float) -> None:
        if now >= self.start + self.window - _EPS:
            self.start, self.used = now, 0

    def try_acquire(self, now: float) -> bool:
        self._roll(now)
        if self.used >= self.limit:
            return False
        self.used += 1
        return True

    def remaining(self, now: float) -> int:
        self._roll(now)
        return self.limit - self.used

    def reset_in(self, now: float) -> float:
        """Seconds until the open window closes (0.0: none is open)."""
        return max(0.0, self.start + self.window - now)


def max_in_window(times: Iterable[float], window: float) -> int:
    """The most timestamps falling in any half-open interval ``[t, t + window)``."""
    ts = sorted(times)
    best = lo = 0
    for hi, t in enumerate(ts):
        while t - ts[lo] >= window - _EPS:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


class _IPStats:
    __slots__ = ("status", "arrivals", "statuses", "accepted")

    def __init__(self) -> None:
        self.status: Counter[int] = Counter()
        self.arrivals: list[float] = []
        self.statuses: list[int] = []  # parallel to arrivals
        self.accepted: list[float] = []


def _summary(
    status: Counter[int], arrivals: int, accepted: list[float] | int
) -> dict[str, Any]:
    counts = {str(s): status.get(s, 0) for s in _STATUSES}
    counts.update((str(s), n) for s, n in sorted(status.items()) if s not in _STATUSES)
    out: dict[str, Any] = {"status": counts, "arrivals": arrivals}
    if isinstance(accepted, list):
        # first/last accepted arrival (origin clock): lets a report compute achieved rates
        out["accepted"] = len(accepted)
        out["accepted_span"] = [accepted[0], accepted[-1]] if accepted else None
    else:
        out["accepted"] = accepted
    return out


_INDEX = (
    b"<!DOCTYPE html>\n<html><head><title>Lab origin</title></head><body>\n"
    b'<h1>Lab origin</h1>\n<p><a href="/page/0">page 0</a></p>\n</body></html>\n'
)
_BLOCKED = (
    b"<!DOCTYPE html>\n<html><head><title>Access denied</title></head><body>\n"
    b"<h1>Access denied</h1>\n<p>Your IP address has been blocked. Please solve the "
    b'captcha to continue.</p>\n<div class="captcha" id="captcha"></div>\n</body></html>\n'
)


def _page(n: int, ip: str) -> bytes:
    a, b = 2 * n + 1, 2 * n + 2
    return (
        f"<!DOCTYPE html>\n<html><head><title>Lab page {n}</title></head><body>\n"
        f'<h1>page {n}</h1>\n<p>client <span class="ip">{ip}</span></p>\n'
        f'<ul><li><a href="/page/{a}">page {a}</a></li>'
        f'<li><a href="/page/{b}">page {b}</a></li></ul>\n</body></html>\n'
    ).encode()


def _error_page(status: int) -> bytes:
    return b"<h1>%d %s</h1>\n" % (status, reason_phrase(status))


def _route(path: bytes) -> int | None:
    """Page number for ``/page/<n>``, -1 for the index, None for anything else (404)."""
    if path == b"/":
        return -1
    if path.startswith(b"/page/"):
        n = path[6:]
        if n.isdigit() and len(n) <= 18:
            return int(n)
    return None


class Origin(ListeningServer):
    """Rate-limited origin server plus the bookkeeping of what it saw."""

    kind = "origin"

    def __init__(
        self,
        config: OriginConfig | None = None,
        *,
        clock: Clock = time.monotonic,
        wallclock: Clock = time.time,
    ) -> None:
        self.config = config or OriginConfig()
        self.clock = clock
        self.wallclock = wallclock  # for Date / HTTP-date Retry-After only
        self._t0 = clock()  # recorded times are relative to this, across resets too
        self._conns = ConnectionTracker()
        super().__init__()
        self.reset()

    # -- bookkeeping -------------------------------------------------------------

    def reset(self) -> None:
        """Forget counters, arrival times and limiter state."""
        self._stats: dict[str, _IPStats] = {}
        self._limiters: dict[str, GCRA | None] = {}
        self._service: dict[str, _Service] = {}
        cfg = self.config
        self._origin_limiter = (
            GCRA(cfg.origin_rate, cfg.origin_burst, self.clock) if cfg.origin_rate else None
        )
        self._stalled: list[tuple[float, str, str]] = []
        self._stall_rng = random.Random(cfg.stall_seed)
        self._stall_paths = frozenset(cfg.stall_paths)
        self._schedule_start: float | None = None  # origin clock of the first request
        self._rate = cfg.rate  # the per-IP rate now in force for IPs that inherit it
        self._answers_due = list(cfg.status_at)  # scheduled answers not given yet
        self._windows: dict[str, FixedWindow] = {}

    def stalled(self) -> list[tuple[float, str, str]]:
        """``(arrival time, client IP, path)`` of every request the origin stalled."""
        return list(self._stalled)

    def _stalls(self, path: bytes) -> bool:
        cfg = self.config
        if _route(path) is None or path == b"/":
            return False  # pages only: the index and 404s are always answered
        name = path.decode("latin-1")
        if name in self._stall_paths:
            if cfg.stall_times is None:
                return True
            return sum(1 for _, _, p in self._stalled if p == name) < cfg.stall_times
        return cfg.stall_fraction > 0 and self._stall_rng.random() < cfg.stall_fraction

    @property
    def schedule_start(self) -> float | None:
        """When the rate schedule started (seconds since origin start, as arrival times
        are), i.e. the first request since the last reset; None before it."""
        return None if self._schedule_start is None else self._schedule_start - self._t0

    def _follow_schedule(self, now: float) -> None:
        cfg = self.config
        if self._schedule_start is None:
            self._schedule_start = now
        if not cfg.rate_schedule:
            return
        rate = cfg.scheduled_rate(now - self._schedule_start)
        if rate == self._rate:
            return
        self._rate = rate
        for ip, limiter in list(self._limiters.items()):
            if not cfg.inherits_rate(ip):
                continue
            if rate is None:
                self._limiters[ip] = None
            elif limiter is None:
                self._limiters[ip] = GCRA(rate, cfg.burst, self.clock)
            else:
                limiter.set_rate(rate)

    def ips(self) -> list[str]:
        return sorted(self._stats)

    def arrival_times(self, ip: str) -> list[float]:
        """Arrival times (seconds since origin start) of every counted request from ``ip``."""
        st = self._stats.get(ip)
        return list(st.arrivals) if st else []

    def accepted_times(self, ip: str) -> list[float]:
        """Arrival times of the requests from ``ip`` that passed the limiters (answered 200)."""
        st = self._stats.get(ip)
        return list(st.accepted) if st else []

    def events(self, ip: str) -> list[tuple[float, int]]:
        """``(arrival time, status)`` of every counted request from ``ip``, in arrival order."""
        st = self._stats.get(ip)
        return list(zip(st.arrivals, st.statuses, strict=True)) if st else []

    def max_in_window(self, ip: str, window: float, accepted_only: bool = False) -> int:
        times = self.accepted_times(ip) if accepted_only else self.arrival_times(ip)
        return max_in_window(times, window)

    def total(self, status: int | str | None = None) -> int:
        """All counted arrivals, or those answered with ``status``."""
        if status is None:
            return sum(len(st.arrivals) for st in self._stats.values())
        return sum(st.status.get(int(status), 0) for st in self._stats.values())

    def stats(self) -> dict[str, Any]:
        total: Counter[int] = Counter()
        ips = {}
        for ip, st in sorted(self._stats.items()):
            total.update(st.status)
            ips[ip] = _summary(st.status, len(st.arrivals), st.accepted)
        arrivals = sum(len(st.arrivals) for st in self._stats.values())
        accepted = sum(len(st.accepted) for st in self._stats.values())
        out: dict[str, Any] = {"ips": ips, "totals": _summary(total, arrivals, accepted)}
        if self._stalled:
            out["stalled"] = len(self._stalled)
        if self.config.rate_schedule or self.config.status_at:
            out["schedule_start"] = self.schedule_start
        if self.config.rate_schedule:
            out["rate"] = self._rate
        if self.config.status_at:
            out["scheduled_answers_left"] = len(self._answers_due)
        return out

    # -- serving -----------------------------------------------------------------

    def listen(self, port: int = 0, interface: str = "127.0.0.1") -> int:
        from twisted.internet import reactor  # lazy: a module-level import installs a reactor

        self._listening = reactor.listenTCP(port, _Site(self), interface=interface)
        logger.debug("origin listening on %s", self.url)
        return self.port

    def stop(self) -> Deferred[Any]:
        waits = [self._conns.abort_all()]
        waits.extend(self._stop_listening())
        return gatherResults(waits, consumeErrors=True)

    def handle(self, request: Request) -> bytes | int:
        path = request.path
        if path.startswith(b"/_lab/"):
            return self._control(request, path)
        cfg = self.config
        ip = request.getClientAddress().host
        now = self.clock()
        self._follow_schedule(now)
        if self._stalls(path):
            self._stalled.append((now - self._t0, ip, path.decode("latin-1")))
            return NOT_DONE_YET  # the connection stays open until the client gives up
        st = self._stats.get(ip)
        if st is None:
            st = self._stats[ip] = _IPStats()
        st.arrivals.append(now - self._t0)
        rule = cfg.per_ip.get(ip)
        delay = cfg.latency + (rule.latency if rule else 0.0)

        if rule is not None and rule.ban:
            return self._answer(request, st, 403, _BLOCKED, delay)
        page = _route(path)
        if page is None:
            return self._answer(request, st, 404, _error_page(404), delay)

        due = self._answer_due(now)
        if due is not None:
            if due.retry_after is not None:
                request.setHeader(b"retry-after", b"%d" % math.ceil(due.retry_after))
            return self._answer(request, st, due.status, _error_page(due.status), delay)

        if ip not in self._limiters:
            rate = self._rate if cfg.inherits_rate(ip) else cfg.rate_for(ip)
            self._limiters[ip] = GCRA(rate, cfg.burst, self.clock) if rate else None
        limiter = self._limiters[ip]
        window = self._window(ip)
        if limiter is not None and limiter.wait_time(now) > 0:
            self._limited_headers(request, limiter, now)
            return self._answer(request, st, 429, _error_page(429), delay)
        if window is not None and window.remaining(now) < 1:
            self._window_headers(request, window, now)
            self._limited_headers(request, limiter, now, retry_after=window.reset_in(now))
            return self._answer(request, st, 429, _error_page(429), delay)
        olimiter = self._origin_limiter
        if olimiter is not None and olimiter.wait_time(now) > 0:
            # Nothing was consumed: a rejected request must not move any schedule.
            self._limited_headers(request, limiter, now)
            status = cfg.origin_status
            return self._answer(request, st, status, _error_page(status), delay)
        if limiter is not None:
            limiter.try_acquire(now)
            if cfg.ratelimit_headers:
                self._ratelimit_headers(request, limiter, now)
        if window is not None:
            window.try_acquire(now)
            self._window_headers(request, window, now)
        if olimiter is not None:
            olimiter.try_acquire(now)
        st.accepted.append(now - self._t0)
        return self._answer(request, st, 200, _INDEX if page < 0 else _page(page, ip), delay)

    def _answer_due(self, now: float) -> ScheduledAnswer | None:
        """The scheduled answer this request gets, if one is due (each is given once)."""
        due = self._answers_due
        if not due or self._schedule_start is None:
            return None
        if now - self._schedule_start + _EPS >= due[0].at:
            return due.pop(0)
        return None

    def _window(self, ip: str) -> FixedWindow | None:
        cfg = self.config
        if cfg.window_limit is None:
            return None
        window = self._windows.get(ip)
        if window is None:
            window = self._windows[ip] = FixedWindow(cfg.window_limit, cfg.window)
        return window

    def _window_headers(self, request: Request, window: FixedWindow, now: float) -> None:
        left = window.reset_in(now)
        if self.config.window_reset == "epoch":
            reset = math.ceil(self.wallclock() + left)
        else:
            reset = math.ceil(left - _EPS)
        request.setHeader(b"x-ratelimit-limit", b"%d" % window.limit)
        request.setHeader(b"x-ratelimit-remaining", b"%d" % window.remaining(now))
        request.setHeader(b"x-ratelimit-reset", b"%d" % reset)

    def _limited_headers(self, request: Request, limiter: GCRA | None, now: float,
                         retry_after: float | None = None) -> None:
        cfg = self.config
        wait = cfg.retry_after if retry_after is None else retry_after
        if cfg.retry_after_mode == "seconds":
            request.setHeader(b"retry-after", b"%d" % max(0, math.ceil(wait - _EPS)))
        elif cfg.retry_after_mode == "http-date":
            wall = self.wallclock()
            request.setHeader(b"date", formatdate(wall, usegmt=True).encode())
            when = math.ceil(wall + max(0.0, wait))
            request.setHeader(b"retry-after", formatdate(when, usegmt=True).encode())
        if cfg.ratelimit_headers and limiter is not None:
            self._ratelimit_headers(request, limiter, now)

    @staticmethod
    def _ratelimit_headers(request: Request, limiter: GCRA, now: float) -> None:
        limit, window = limiter.policy()
        remaining = limiter.remaining(now)
        reset = math.ceil(limiter.wait_time(now))
        request.setHeader(b"x-ratelimit-limit", b"%d" % limit)
        request.setHeader(b"x-ratelimit-remaining", b"%d" % remaining)
        request.setHeader(b"x-ratelimit-reset", b"%d" % reset)
        request.setHeader(
            b"ratelimit", b"limit=%d, remaining=%d, reset=%d" % (limit, remaining, reset)
        )
        request.setHeader(b"ratelimit-policy", b"%d;w=%d" % (limit, window))

    def _answer(
        self, request: Request, st: _IPStats, status: int, body: bytes, delay: float
    ) -> bytes | int:
        st.status[status] += 1
        st.statuses.append(status)
        _set(request, status, body, _HTML)
        if self.config.announce_policy is not None:
            request.setHeader(b"ratelimit-policy", self.config.announce_policy.encode())
        body_time = self.config.body_time
        if delay <= 0 and body_time <= 0:
            return body
        if self.config.capacity is not None or self.config.per_ip:
            capacity = self.config.capacity_for(request.getClientAddress().host)
            if capacity is not None:
                return self._serve_within(request, body, delay, body_time, capacity)
        # Delay without blocking; a client that hangs up cancels its pending answer.
        job = _Job(request, body, delay, body_time)
        request.notifyFinish().addErrback(lambda _: _cancel(job))
        _schedule(job, lambda: None)
        return NOT_DONE_YET

    def _serve_within(self, request: Request, body: bytes, delay: float, body_time: float,
                      capacity: int) -> int:
        """Answer after ``delay`` once fewer than ``capacity`` answers to this IP are in
        service; queue FIFO until then (the decision was already made on arrival)."""
        ip = request.getClientAddress().host
        service = self._service.get(ip)
        if service is None:
            service = self._service[ip] = _Service(capacity)
        job = _Job(request, body, delay, body_time)
        # a client that hangs up leaves the queue, or frees its place in service
        request.notifyFinish().addErrback(lambda _: self._hung_up(service, job))
        service.queue.append(job)
        self._start_service(service)
        return NOT_DONE_YET

    def _start_service(self, service: _Service) -> None:
        while service.busy < service.capacity and service.queue:
            job = service.queue.popleft()
            if job.gone:
                continue
            service.busy += 1
            _schedule(job, lambda: self._served(service))

    def _served(self, service: _Service) -> None:
        service.busy -= 1
        self._start_service(service)

    def _hung_up(self, service: _Service, job: _Job) -> None:
        if job.gone:
            return
        job.gone = True
        if job.call is not None:  # in service: free the place
            job.call.cancel()
            job.call = None
            service.busy -= 1
            self._start_service(service)

    def _control(self, request: Request, path: bytes) -> bytes:
        # Control routes are neither rate-limited nor counted.
        if path == b"/_lab/stats":
            return _set(request, 200, json.dumps(self.stats()).encode(), b"application/json")
        if path == b"/_lab/events":  # every arrival as [time, status], per IP
            events = {ip: self.events(ip) for ip in self.ips()}
            return _set(request, 200, json.dumps(events).encode(), b"application/json")
        if path == b"/_lab/reset":
            if request.method != b"POST":
                request.setHeader(b"allow", b"POST")
                return _set(request, 405, b'{"error": "POST only"}', b"application/json")
            self.reset()
            return _set(request, 200, b'{"ok": true}', b"application/json")
        return _set(request, 404, b'{"error": "not found"}', b"application/json")


def _set(request: Request, status: int, body: bytes, content_type: bytes) -> bytes:
    request.setResponseCode(status, reason_phrase(status))
    request.setHeader(b"content-type", content_type)
    request.setHeader(b"content-length", b"%d" % len(body))
    return body


def _schedule(job: _Job, served: Callable[[], None]) -> None:
    """Send ``job``'s answer after its delay, the body over its body_time; then ``served``."""
    from twisted.internet import reactor

    body, pieces = job.body, BODY_PIECES if job.body_time > 0 else 1
    size = -(-len(body) // pieces)
    chunks = [body[i:i + size] for i in range(0, len(body), size)] or [b""]
    step = job.body_time / max(1, len(chunks) - 1)

    def send(i: int) -> None:
        job.call = None
        if job.gone:
            return
        job.request.write(chunks[i])
        if i + 1 < len(chunks):
            job.call = reactor.callLater(step, send, i + 1)
            return
        job.gone = True
        job.request.finish()
        served()

    job.call = reactor.callLater(job.delay, send, 0)


def _cancel(job: _Job) -> None:
    job.gone = True
    if job.call is not None and job.call.active():
        job.call.cancel()


class _Root(Resource):
    isLeaf = True

    def __init__(self, origin: Origin) -> None:
        super().__init__()
        self.origin = origin

    def render(self, request: Request) -> bytes | int:
        return self.origin.handle(request)


class _Channel(HTTPChannel):
    def connectionMade(self) -> None:
        super().connectionMade()
        self.site.origin._conns.opened(self)

    def connectionLost(self, reason: Any) -> None:
        super().connectionLost(reason)
        self.site.origin._conns.closed(self)


class _Site(Site):
    protocol = _Channel
    noisy = False

    def __init__(self, origin: Origin) -> None:
        super().__init__(_Root(origin))
        self.origin = origin

    def log(self, request: Request) -> None:
        pass  # no access log: thousands of lines per benchmark run are only noise
