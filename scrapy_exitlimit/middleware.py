"""Downloader middleware: park each request until its origin, pair and exit all admit it."""

from __future__ import annotations

import ipaddress
import logging
import math
import time
from collections.abc import Mapping
from functools import lru_cache
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from scrapy import Request, signals
from scrapy.downloadermiddlewares.httpcache import HttpCacheMiddleware
from scrapy.http import Response
from scrapy.utils.defer import deferred_from_coro, maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.misc import load_object
from twisted.internet.error import TCPTimedOutError
from twisted.internet.error import TimeoutError as TwistedTimeoutError

from ._compat import (
    close_spider,
    download_exceptions,
    engine_closing,
    served_from_cache,
    set_slot_settings,
)
from .admission import AdmissionQueue, ExitsUnavailable, HandedBack, Repin, Waiter, call_later
from .backends import load_backend
from .config import ExitLimitConfig
from .core import Event, EventKind, Lease, bounded_cooldown, parse_retry_after
from .core.health import CpuLoad
from .core.ratelimit_headers import QuotaWindows, parse_ratelimit
from .core.scopes import Scope
from .failclosed import EXPECTED_PROXY_KEY
from .handlers import delivers_feedback
from .policy import ResponsePolicy, Signal
from .progress import Snapshot
from .prometheus import PrometheusMetrics
from .room import DownloaderRoom
from .sessions import StickySessions
from .state_file import StateFile
from .telemetry import Telemetry
from .wiring import check_wiring

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

#: meta key holding the lease id of an admitted request (an int: JOBDIR can pickle it)
LEASE_KEY = "_exitlimit_lease"
#: meta key carrying what the answer meant from the wire to process_response
SIGNAL_KEY = "_exitlimit_signal"
#: meta keys this middleware writes; cleared on every re-issue
OWN_KEYS = (LEASE_KEY, SIGNAL_KEY, "exitlimit_exit", "exitlimit_wait", "proxy", "download_slot",
            EXPECTED_PROXY_KEY)
CLOSE_WATCH_INTERVAL = 0.2
#: how often idle pair and origin state is dropped (seconds)
FORGET_EVERY = 60.0
#: how often changed origin-wide and scope rates go to telemetry and metrics (seconds)
RATES_EVERY = 1.0
SLOT_PREFIX = "exitlimit@"
#: answers after which the request is sent again through another exit
#: (as kept in meta: the signals' values)
REISSUE = frozenset(signal.value for signal in (
    Signal.RATE_LIMITED, Signal.BANNED, Signal.OVERLOADED, Signal.PROXY_FAULT))
#: stat name per signal
SIGNAL_STATS = {
    Signal.RATE_LIMITED: "exitlimit/response_429",
    Signal.BANNED: "exitlimit/ban",
    Signal.OVERLOADED: "exitlimit/overload",
    Signal.PROXY_FAULT: "exitlimit/proxy_fault",
}
CLOSE_REASON_NO_EXITS = "exitlimit_no_exits"
#: timeouts, which the origin may cause as well as the exit
TIMEOUTS: tuple[type[BaseException], ...] = (
    *download_exceptions("DownloadTimeoutError"), TwistedTimeoutError, TCPTimedOutError)


def exit_ip(value: bytes | None) -> str | None:
    """The address in an exit-IP response header, or None when it is not one."""
    if not value or len(value) > 64:
        return None
    try:
        return str(ipaddress.ip_address(value.decode("ascii").strip()))
    except (UnicodeDecodeError, ValueError):
        return None


def origin_of(request: Request) -> str:
    """scheme://host[:port], or the request's ``exitlimit_origin`` (to group hosts as one)."""
    if key := request.meta.get("exitlimit_origin"):
        return str(key)
    parts = urlparse_cached(request)
    return _origin(parts.scheme, parts.netloc)


@lru_cache(maxsize=4096)  # every request asks, and a crawl sees few hosts
def _origin(scheme: str, netloc: str) -> str:
    parts = urlsplit("//" + netloc)  # host and port are the netloc's alone
    default_port = {"http": 80, "https": 443}.get(scheme)
    host = (parts.hostname or "").lower()
    if parts.port and parts.port != default_port:
        return f"{scheme}://{host}:{parts.port}"
    return f"{scheme}://{host}"


class RateChanges:
    """Rates by key as last recorded (absent: not limited), and what differs now.

    Learned rates move on many answers: polled, they make a record a second at most.
    """

    def __init__(self) -> None:
        self.recorded: dict[str, float] = {}

    def update(self, rates: Mapping[str, float | None]) -> dict[str, float | None]:
        """The keys whose rate is new or changed, and None for keys no longer limited."""
        limited = {key: rate for key, rate in rates.items() if rate is not None}
        changed: dict[str, float | None] = {
            key: rate for key, rate in limited.items() if self.recorded.get(key) != rate}
        changed.update((key, None) for key in self.recorded if key not in limited)
        self.recorded = limited
        return changed


class _Tally:
    """Counts of admissions, parked requests and waits since the last flush to stats."""

    __slots__ = ("admitted", "parked", "parked_max", "wait_max", "wait_sum", "waits")

    def __init__(self) -> None:
        self.admitted = self.parked = self.parked_max = self.waits = 0
        self.wait_sum = self.wait_max = 0.0


class ExitLimitMiddleware:
    """Assigns each request an exit at the moment it can be sent, and learns from answers.

    Order it between RetryMiddleware (550) and HttpProxyMiddleware (750); the
    add-on uses 585, so it sees a 429 before RetryMiddleware and the raw
    status before redirects.
    """

    def __init__(self, crawler: Crawler, config: ExitLimitConfig) -> None:
        self.crawler = crawler
        self.config = config
        self.stats = crawler.stats
        self.backend = load_backend(crawler, config)
        try:
            policy_cls = load_object(config.policy)
        except (ImportError, NameError, ValueError, AttributeError) as exc:
            raise ValueError(f"EXITLIMIT_POLICY ({config.policy}) cannot be loaded: {exc}") \
                from None
        if not (isinstance(policy_cls, type) and issubclass(policy_cls, ResponsePolicy)):
            raise ValueError(f"EXITLIMIT_POLICY ({config.policy}) must be a ResponsePolicy "
                             "subclass")
        self.policy: ResponsePolicy = policy_cls()
        self.exits = {ex.id: ex for ex in config.exits}
        self.queue = AdmissionQueue(self.backend, self._admitted)
        self.sessions = StickySessions(
            usable=self.backend.usable,
            acquire=self._acquire, waitable=self.queue.waitable, stats=self.stats)
        #: windows of stated quotas that do not say how long their window is
        self.quota_windows = QuotaWindows()
        self.cpu_load = CpuLoad()
        self.room = DownloaderRoom(crawler, config.busy_room)
        telemetry = Telemetry.open(config.telemetry)
        metrics = PrometheusMetrics.serve(config.prometheus_port, config.prometheus_addr,
                                          per_scope=config.stats_per_scope)
        #: where admissions, answers, adjustments and rate changes are recorded (telemetry,
        #: metrics)
        self.sinks: list[Any] = [sink for sink in (telemetry, metrics) if sink is not None]
        #: what was learned, kept between runs (EXITLIMIT_STATE_FILE)
        self.state_file = (StateFile(config.state_file, save_interval=config.state_save_interval,
                                     max_age=config.state_max_age)
                           if config.state_file is not None else None)
        crawler.exitlimit = self  # type: ignore[attr-defined]  # the progress line reads it
        self._watch: Any = None
        self._cache: HttpCacheMiddleware | None = None
        self._blocked_since: dict[str, float] = {}
        self._slots: dict[str, str] = {}  # exit id -> its download slot
        #: per-request counts, added to Scrapy's stats a few times a second and at the end
        #: (a stats call costs more than the rest of an admission's bookkeeping)
        self._tally = _Tally()
        self._pool_dead_since: float | None = None
        self._forgot_at = -math.inf
        self._rates_at = -math.inf
        self._origin_rates = RateChanges()
        self._scope_rates = RateChanges()
        crawler.signals.connect(self._spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self._spider_closed, signal=signals.spider_closed)
        #: answers come from this package's download handler (it serves http and https),
        #: not through Scrapy's signals: the same point of a download, without a dispatch
        self.feedback_from_handler = delivers_feedback(crawler.settings)
        if not self.feedback_from_handler:
            crawler.signals.connect(self.response_downloaded,
                                    signal=signals.response_downloaded)
            crawler.signals.connect(self.left_downloader, signal=signals.request_left_downloader)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ExitLimitMiddleware:
        config = ExitLimitConfig.from_settings(crawler.settings)
        check_wiring(crawler, len(config.exits), config.limits.concurrency)
        return cls(crawler, config)

    # -- lifecycle ---------------------------------------------------------
    def _spider_opened(self, spider: Any = None) -> None:
        limits = self.config.limits
        rate = (f"{limits.rate:g} r/s (burst {limits.burst})" if limits.rate is not None
                else f"learned (from {self.config.tuning.start_rate:g} r/s)")
        logger.info("exitlimit: %d exits, pair rate %s, up to %d in flight per exit; state: %s",
                    len(self.exits), rate, limits.concurrency, self.backend.describe())
        recalled = (self.backend.warm_start(self.state_file) if self.state_file is not None
                    else None)
        self.backend.open()
        if recalled is not None:
            self.stats.set_value("exitlimit/state_origins_loaded", len(recalled.origins))
            self.stats.set_value("exitlimit/state_pairs_loaded", recalled.pairs)
            self.backend.recalled(recalled.origins)
        self._cache = self.crawler.get_downloader_middleware(HttpCacheMiddleware)
        self._schedule_watch()

    async def _spider_closed(self, spider: Any = None, reason: str = "") -> None:
        self._close_queue("spider closed")
        self.room.restore()
        if self.room.narrowings:
            self.stats.set_value("exitlimit/downloader_narrowed", self.room.narrowings)
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        self._flush_tally()
        for name, value in self.backend.stats().items():
            self.stats.set_value(f"exitlimit/{name}", value)
        self._save_state()
        self._record_rates()  # the last change, however short the crawl
        for sink in self.sinks:
            sink.close()
        closing = self.backend.close()
        if closing is not None:
            await maybe_deferred_to_future(closing)

    def _schedule_watch(self) -> None:
        self._watch = call_later(CLOSE_WATCH_INTERVAL, self._check)

    def _check(self) -> None:
        """Periodic: notice the engine closing (no signal fires before it waits for
        us), fail requests no exit can serve, reclaim leaked leases."""
        self._watch = None
        self._flush_tally()
        if engine_closing(self.crawler):
            self._close_queue("engine closing")
            return
        now = self.backend.clock()
        self._check_stalls(now)
        if now - self._forgot_at > FORGET_EVERY:
            self._forgot_at = now
            self.stats.inc_value("exitlimit/pairs_forgotten", self.backend.forget_idle(now))
        if now - self._rates_at >= RATES_EVERY:
            self._rates_at = now
            self._record_rates()
        for lease in self.backend.stale_leases(self.config.lease_timeout, now):
            self.backend.release(lease.id, answered=False)
            self.stats.inc_value("exitlimit/lease_reclaimed")
            logger.warning("exitlimit: reclaimed a lease on %s held for over %gs",
                           lease.exit_id, self.config.lease_timeout)
            self.queue.wake()
        if self._check_pool(now):
            return
        if self.state_file is not None and self.state_file.due():
            self._save_state()
        self._schedule_watch()

    def _flush_tally(self) -> None:
        tally, self._tally = self._tally, _Tally()
        stats = self.stats
        if tally.admitted:
            stats.inc_value("exitlimit/admitted", tally.admitted)
        if tally.parked:
            stats.inc_value("exitlimit/parked", tally.parked)
            stats.max_value("exitlimit/parked_max", tally.parked_max)
        if tally.waits:
            stats.inc_value("exitlimit/wait_seconds", tally.wait_sum, start=0.0)
            stats.max_value("exitlimit/wait_seconds_max", tally.wait_max)

    def _record_rates(self) -> None:
        """Origin-wide and scope rates that changed since last time, to the sinks."""
        if not self.sinks:
            return
        for origin, rate in self._origin_rates.update(self.backend.origin_rates()).items():
            for sink in self.sinks:
                sink.origin_rate(origin, rate)
        for scope, rate in self._scope_rates.update(self.backend.scope_rates()).items():
            for sink in self.sinks:
                sink.scope_rate(scope, rate)

    def _save_state(self) -> None:
        if self.state_file is not None and self.backend.save_state(self.state_file):
            self.stats.inc_value("exitlimit/state_saved")

    def _check_stalls(self, now: float) -> None:
        timeout = self.config.stall_timeout
        self._check_pins(now)
        for origin in self.queue.origins():
            if self.backend.any_usable(origin, now):
                self._blocked_since.pop(origin, None)
                continue
            since = self._blocked_since.setdefault(origin, now)
            if now - since >= timeout:
                failed = self.queue.fail(origin, ExitsUnavailable(
                    f"no usable exit for {origin} for {timeout:g}s "
                    "(EXITLIMIT_STALL_TIMEOUT): every exit banned or dead"))
                self.stats.inc_value("exitlimit/stalled", failed)
                logger.warning("exitlimit: failing %d request(s) for %s: no usable exit for "
                               "%gs", failed, origin, timeout)

    def _check_pins(self, now: float) -> None:
        """Requests parked on a pinned exit that can no longer serve them: admit anywhere."""
        for origin, pinned, _ in [k for k in self.queue.queues if k[1] is not None]:
            if not self.backend.usable(origin, pinned, now):
                # StickySessions counts the re-pins
                self.queue.fail(origin, Repin(), pinned_to=pinned)

    def _check_pool(self, now: float) -> bool:
        """The whole pool dead for EXITLIMIT_STALL_TIMEOUT: close the spider, loudly."""
        if self.backend.pool_alive(now):
            self._pool_dead_since = None
            return False
        if self._pool_dead_since is None:
            self._pool_dead_since = now
            logger.warning("exitlimit: every exit is evicted; waiting for reanimation")
        if now - self._pool_dead_since < self.config.stall_timeout:
            return False
        logger.error("exitlimit: every exit has been dead for %gs, closing the spider (%s)",
                     self.config.stall_timeout, CLOSE_REASON_NO_EXITS)
        self._close_queue("no exits left")
        deferred_from_coro(self._close_spider())
        return True

    async def _close_spider(self) -> None:
        await close_spider(self.crawler, CLOSE_REASON_NO_EXITS)

    def _close_queue(self, why: str) -> None:
        if self.queue.closed:
            return
        handed = self.queue.close()
        if handed:
            logger.info("exitlimit: %s, handing %d parked request(s) back to the scheduler",
                        why, handed)

    # -- admission ---------------------------------------------------------
    def _admitted(self, waiter: Waiter | None, lease: Lease, now: float) -> None:
        tally = self._tally
        tally.admitted += 1
        if self.config.stats_per_exit:
            self.stats.inc_value(f"exitlimit/exit/{lease.exit_id}/admitted")
        if lease.scopes:
            self.stats.inc_value("exitlimit/scoped")
            if self.config.stats_per_scope:
                for scope in lease.scopes:
                    self.stats.inc_value(f"exitlimit/scope/{scope.id}/admitted")
        waited = 0.0
        if waiter is not None:
            waited = now - waiter.parked_at
            tally.waits += 1
            tally.wait_sum += waited
            tally.wait_max = max(tally.wait_max, waited)
        if self.sinks:
            load = self.backend.exit_load(lease.exit_id)
            for sink in self.sinks:
                sink.admission(lease.origin, lease.exit_id, waited, lease.rate, load.limit,
                               load.in_flight, scopes=[s.id for s in lease.scopes])

    def snapshot(self) -> Snapshot:
        """Exits by state (for the origins now waiting, else all), totals, parked; the
        named scopes and the origins paced as a whole, with the slowest of each."""
        self._flush_tally()
        now = self.backend.clock()
        counts = self.backend.exit_states(now, self.queue.origins())
        scope_rates = self.backend.scope_rates()
        origin_rates = self.backend.origin_rates()
        return Snapshot(
            exits_ready=counts["ready"], exits_cooling=counts["cooling"],
            exits_banned=counts["banned"], exits_dead=counts["dead"],
            admitted_total=self.stats.get_value("exitlimit/admitted", 0),
            rate_limited_total=self.stats.get_value("exitlimit/response_429", 0),
            parked=self.queue.parked + self.sessions.following,
            scopes=len(scope_rates),
            slowest_scope_rate=min((r for r in scope_rates.values() if r is not None),
                                   default=None),
            origins_paced=len(origin_rates),
            slowest_origin_rate=min(origin_rates.values(), default=None))

    async def process_request(self, request: Request, spider: Any = None) -> Request | None:
        if request.meta.get("dont_exitlimit") or urlparse_cached(request).scheme not in (
            "http", "https"
        ):
            return None
        self._release(request)  # a retried copy may still carry its old lease
        if self._cache is not None and served_from_cache(self._cache, request, self.crawler):
            self.stats.inc_value("exitlimit/cache_hit")
            return None
        origin = origin_of(request)
        scopes = self.config.scopes.scopes(request.meta.get("exitlimit_scope"))
        parked_at = self.backend.clock()
        session = request.meta.get("exitlimit_session")
        try:
            if session is None:
                lease = await self._acquire(origin, None, scopes)
            else:
                lease = await self.sessions.admit(origin, str(session), scopes)
        except HandedBack:
            self.stats.inc_value("exitlimit/requeued_on_close")
            return self._fresh_copy(request)
        exit_ = self.exits[lease.exit_id]
        meta = request.meta
        meta[LEASE_KEY] = lease.id
        meta["exitlimit_exit"] = exit_.id
        meta["exitlimit_wait"] = lease.admitted_at - parked_at
        meta["proxy"] = exit_.url
        meta[EXPECTED_PROXY_KEY] = (exit_.address, exit_.has_credentials)  # handlers.py checks
        meta["download_slot"] = self._slot_for(exit_.id)
        meta["autothrottle_dont_adjust_delay"] = True
        return None

    async def _acquire(self, origin: str, pinned: str | None,
                       scopes: tuple[Scope, ...] = ()) -> Lease:
        """A lease for ``origin`` (on exit ``pinned`` only, when given; with a token of
        each of ``scopes``), parking until there is one."""
        lease_or_wait = self.queue.acquire(origin, pinned, scopes)
        if isinstance(lease_or_wait, Lease):
            return lease_or_wait
        tally = self._tally
        tally.parked += 1
        tally.parked_max = max(tally.parked_max, self.queue.parked)
        return await lease_or_wait  # a future on asyncio, a Deferred on other reactors

    def _slot_for(self, exit_id: str) -> str:
        """One download slot per exit, as wide as the exit's cap and with no delay of its own."""
        key = self._slots.get(exit_id)
        if key is None:  # its settings are made once (set_slot_settings keeps the first)
            key = self._slots[exit_id] = SLOT_PREFIX + exit_id
            set_slot_settings(self.crawler, key, self.backend.exit_load(exit_id).ceiling)
        return key

    @staticmethod
    def _fresh_copy(request: Request, **meta: Any) -> Request:
        new_meta = {k: v for k, v in request.meta.items() if k not in OWN_KEYS}
        new_meta.update(meta)
        return request.replace(meta=new_meta, dont_filter=True)

    # -- feedback ----------------------------------------------------------
    def _release(self, request: Request, answered: bool = False) -> None:
        lease_id = request.meta.pop(LEASE_KEY, None)
        if lease_id is not None and self.backend.release(lease_id, answered) is not None:
            self.queue.wake()

    def left_downloader(self, request: Request, spider: Any = None) -> None:
        """The request's download ended (answered or not): its lease goes back."""
        self._release(request)

    def response_downloaded(self, response: Response, request: Request,
                            spider: Any = None) -> None:
        """Feedback straight from the wire, before any other middleware reacts (from the
        download handler, or Scrapy's ``response_downloaded`` signal)."""
        lease = self.backend.lease(request.meta.get(LEASE_KEY, -1))
        if lease is None:
            return
        signal = self.policy.classify_response(request, response)
        request.meta[SIGNAL_KEY] = signal.value
        self._count(signal, lease.exit_id)
        if self.config.stats_per_scope and signal is Signal.RATE_LIMITED:
            for scope in lease.scopes:
                self.stats.inc_value(f"exitlimit/scope/{scope.id}/response_429")
        events: list[Event] = []
        if self.config.exit_ip_header:
            ip = exit_ip(response.headers.get(self.config.exit_ip_header))
            if ip is not None:
                events += self.backend.exit_ip_seen(lease.exit_id, ip)
        if signal is Signal.RATE_LIMITED:
            cooldown = bounded_cooldown(self._retry_after(response),
                                        floor=self.config.cooldown_min,
                                        cap=self.config.cooldown_max,
                                        default=self.config.cooldown_default)
            events += self.backend.rate_limited(lease, cooldown)
        elif signal is Signal.OK:
            latency = self.backend.clock() - lease.admitted_at
            wall = time.monotonic()
            if self.cpu_load.due(wall):
                busy = self.cpu_load.sample(wall, time.process_time())
                self.backend.cpu_bound(busy)
                self.room.update(busy, self.queue.parked + self.sessions.following,
                                 len(self.queue.queues))
            events += self.backend.success(lease, latency)
            # Headers' own store: its names are normalized already (its items() would
            # normalize each again)
            quota = parse_ratelimit(dict(dict.items(response.headers)), now=time.time())
            if quota is not None:
                rate = self.quota_windows.rate((lease.origin, lease.pair), quota, latency)
                events += self.backend.announced(lease, rate, quota.remaining, quota.reset)
        elif signal is Signal.BANNED:
            events += self.backend.banned(lease)
        elif signal is Signal.OVERLOADED:
            events += self.backend.overloaded(lease, self._retry_after(response))
        elif signal is Signal.PROXY_FAULT:
            events += self.backend.proxy_fault(lease, lease.exit_id)
        self._report(events)
        if self.sinks:
            self._record_answer(lease, response.status, signal)
        self._release(request, answered=signal is not Signal.PROXY_FAULT)

    def _record_answer(self, lease: Lease, status: int, signal: Signal) -> None:
        load = self.backend.exit_load(lease.exit_id)
        rate = self.backend.paced_rate(lease.origin, lease.exit_id)
        latency = self.backend.clock() - lease.admitted_at
        for sink in self.sinks:
            sink.response(lease.origin, lease.exit_id, status=status, signal=signal.value,
                          latency=latency, rate=rate, limit=load.limit,
                          in_flight=load.in_flight)

    @staticmethod
    def _retry_after(response: Response) -> float | None:
        return parse_retry_after(response.headers.get(b"Retry-After"),
                                 date=response.headers.get(b"Date"), now=time.time())

    def _count(self, signal: Signal, exit_id: str) -> None:
        stat = SIGNAL_STATS.get(signal)
        if stat is None:
            return
        self.stats.inc_value(stat)
        if self.config.stats_per_exit:
            self.stats.inc_value(f"exitlimit/exit/{exit_id}/{stat.rsplit('/', 1)[1]}")

    def _report(self, events: list[Event]) -> None:
        """One stat and one log line per adjustment (INFO with EXITLIMIT_DEBUG, else DEBUG)."""
        level = logging.INFO if self.config.debug else logging.DEBUG
        for sink in self.sinks:
            sink.events(events)
        for ev in events:
            if ev.kind is not EventKind.COOLDOWN:
                self.stats.inc_value(f"exitlimit/{ev.kind}")
            if logger.isEnabledFor(level):
                logger.log(level, "exitlimit: %s %s%s: %s", ev.kind, ev.origin,
                           f" via {ev.exit_id}" if ev.exit_id else "", ev.detail)
        if events:
            self.queue.changed({ev.origin for ev in events})

    def process_response(self, request: Request, response: Response,
                         spider: Any = None) -> Request | Response:
        self._release(request)  # a cache hit never reaches the downloader
        value = request.meta.get(SIGNAL_KEY)
        if value not in REISSUE:
            return response
        return self._reissue(request, Signal(value), f"HTTP {response.status}") or response

    def process_exception(self, request: Request, exception: Exception,
                          spider: Any = None) -> Request | None:
        self._release(request)
        exit_id = request.meta.get("exitlimit_exit")
        if exit_id is None or isinstance(exception, (HandedBack, ExitsUnavailable)):
            return None
        signal = self.policy.classify_exception(request, exception)
        if signal is not Signal.PROXY_FAULT:
            return None
        self._count(signal, exit_id)
        timeout = isinstance(exception, TIMEOUTS)
        self._report(self.backend.proxy_fault(None, exit_id, origin_of(request), timeout))
        for sink in self.sinks:
            sink.response(origin_of(request), exit_id, status=None, signal=signal.value)
        return self._reissue(request, signal, type(exception).__name__)

    def _reissue(self, request: Request, signal: Signal, what: str) -> Request | None:
        """Send it again (another exit will take it), within the request's own budget."""
        retries = request.meta.get("exitlimit_retries", 0) + 1
        max_retries = request.meta.get("exitlimit_max_retries", self.config.max_retries)
        if retries <= max_retries:
            self.stats.inc_value("exitlimit/reissued")
            self.stats.inc_value(f"exitlimit/reissued/{signal.value}")
            logger.debug("exitlimit: re-issuing %s after %s via %s (%d/%d)", request, what,
                         request.meta.get("exitlimit_exit"), retries, max_retries)
            return self._fresh_copy(request, exitlimit_retries=retries)
        self.stats.inc_value("exitlimit/gave_up")
        self.stats.inc_value(f"exitlimit/gave_up/{signal.value}")
        logger.warning("exitlimit: gave up on %s after %d attempts (last: %s, %s); passing it on",
                       request, retries, what, signal.value)
        request.meta["dont_retry"] = True  # RetryMiddleware must not start over
        return None
