"""Downloader middleware: park each request until its origin, pair and exit all admit it."""

from __future__ import annotations

import logging
import random
import time
from typing import TYPE_CHECKING, Any

from scrapy import Request, signals
from scrapy.downloadermiddlewares.httpcache import HttpCacheMiddleware
from scrapy.http import Response
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached

from .admission import AdmissionQueue, HandedBack, Waiter, _call_later
from .config import DEFAULT_PAIR_RATE, ExitLimitConfig
from .core import Lease, Limiter, bounded_cooldown, parse_retry_after

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

#: meta key holding the lease id of an admitted request (an int: JOBDIR can pickle it)
LEASE_KEY = "_exitlimit_lease"
#: meta keys this middleware writes; cleared on every re-issue
OWN_KEYS = (LEASE_KEY, "exitlimit_exit", "exitlimit_wait", "proxy", "download_slot")
CLOSE_WATCH_INTERVAL = 0.2
SLOT_PREFIX = "exitlimit@"


def origin_of(request: Request) -> str:
    """scheme://host[:port], or the request's ``exitlimit_origin`` (to group hosts as one)."""
    if key := request.meta.get("exitlimit_origin"):
        return str(key)
    parts = urlparse_cached(request)
    default_port = {"http": 80, "https": 443}.get(parts.scheme)
    host = (parts.hostname or "").lower()
    if parts.port and parts.port != default_port:
        return f"{parts.scheme}://{host}:{parts.port}"
    return f"{parts.scheme}://{host}"


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
        self.limiter = Limiter(
            config.exits,
            config.limits,
            clock=time.monotonic,
            margin=config.margin,
            jitter=config.jitter,
            rng=random.Random(),
        )
        self.exits = {ex.id: ex for ex in config.exits}
        self.queue = AdmissionQueue(self.limiter, self._admitted)
        self._watch: Any = None
        self._cache: HttpCacheMiddleware | None = None
        crawler.signals.connect(self._spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self._spider_closed, signal=signals.spider_closed)
        crawler.signals.connect(self._response_downloaded, signal=signals.response_downloaded)
        crawler.signals.connect(self._left_downloader, signal=signals.request_left_downloader)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ExitLimitMiddleware:
        return cls(crawler, ExitLimitConfig.from_settings(crawler.settings))

    # -- lifecycle ---------------------------------------------------------
    def _spider_opened(self, spider: Any = None) -> None:
        if not self.config.rate_given:
            logger.info("EXITLIMIT_RATE is unset: pacing every (origin, exit) pair at %g r/s",
                        DEFAULT_PAIR_RATE)
        logger.info("exitlimit: %d exits, pair rate %g r/s (burst %d), %d in flight per exit",
                    len(self.exits), self.config.limits.rate, self.config.limits.burst,
                    self.config.limits.concurrency)
        middlewares = self.crawler.engine.downloader.middleware.middlewares
        self._cache = next((m for m in middlewares if isinstance(m, HttpCacheMiddleware)), None)
        self._schedule_watch()

    def _spider_closed(self, spider: Any = None, reason: str = "") -> None:
        self._close_queue("spider closed")
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None

    def _schedule_watch(self) -> None:
        self._watch = _call_later(CLOSE_WATCH_INTERVAL, self._check)

    def _check(self) -> None:
        """Notice the engine closing (no signal fires before it waits for us) and reclaim leases."""
        self._watch = None
        engine = self.crawler.engine
        slot = getattr(engine, "_slot", None)
        if engine is None or not engine.running or slot is None or slot.closing is not None:
            self._close_queue("engine closing")
            return
        for lease in self.limiter.stale_leases(self.config.lease_timeout):
            self.limiter.release(lease.id)
            self.stats.inc_value("exitlimit/lease_reclaimed")
            logger.warning("exitlimit: reclaimed a lease on %s held for over %gs",
                           lease.exit_id, self.config.lease_timeout)
            self.queue.wake()
        self._schedule_watch()

    def _close_queue(self, why: str) -> None:
        if self.queue.closed:
            return
        handed = self.queue.close()
        if handed:
            logger.info("exitlimit: %s, handing %d parked request(s) back to the scheduler",
                        why, handed)

    # -- admission ---------------------------------------------------------
    def _admitted(self, waiter: Waiter | None, lease: Lease, now: float) -> None:
        self.stats.inc_value("exitlimit/admitted")
        if self.config.stats_per_exit:
            self.stats.inc_value(f"exitlimit/exit/{lease.exit_id}/admitted")
        if waiter is not None:
            waited = now - waiter.parked_at
            self.stats.inc_value("exitlimit/wait_seconds", waited, start=0.0)
            self.stats.max_value("exitlimit/wait_seconds_max", waited)

    async def process_request(self, request: Request, spider: Any = None) -> Request | None:
        if request.meta.get("dont_exitlimit") or urlparse_cached(request).scheme not in (
            "http", "https"
        ):
            return None
        self._release(request)  # a retried copy may still carry its old lease
        if self._cache is not None and self._served_from_cache(request):
            self.stats.inc_value("exitlimit/cache_hit")
            return None
        origin = origin_of(request)
        parked_at = self.limiter.clock()
        try:
            got = self.queue.acquire(origin)
            if not isinstance(got, Lease):
                self.stats.inc_value("exitlimit/parked")
                self.stats.max_value("exitlimit/parked_max", self.queue.parked)
                got = await maybe_deferred_to_future(got)
        except HandedBack:
            return self._hand_back(request)
        exit_ = self.exits[got.exit_id]
        meta = request.meta
        meta[LEASE_KEY] = got.id
        meta["exitlimit_exit"] = exit_.id
        meta["exitlimit_wait"] = got.admitted_at - parked_at
        meta["proxy"] = exit_.url
        meta["download_slot"] = self._slot_for(exit_.id)
        meta["autothrottle_dont_adjust_delay"] = True
        return None

    def _served_from_cache(self, request: Request) -> bool:
        """HttpCacheMiddleware (900) will answer this request: it must not wait or spend tokens.

        Asks the cache's own policy and storage the question its process_request
        will ask, after us in the chain.
        """
        cache = self._cache
        assert cache is not None
        if request.meta.get("dont_cache"):
            return False
        if cache.ignore_missing:
            return True  # nothing leaves the process: a miss is dropped by the cache
        try:
            if not cache.policy.should_cache_request(request):
                return False
            cached = cache.storage.retrieve_response(self.crawler.spider, request)
            return cached is not None and cache.policy.is_cached_response_fresh(cached, request)
        except Exception:  # the cache logs its own read errors; for us it is a miss
            return False

    def _slot_for(self, exit_id: str) -> str:
        """One download slot per exit, as wide as the exit's cap and with no delay of its own."""
        key = SLOT_PREFIX + exit_id
        downloader = self.crawler.engine.downloader
        if key not in downloader.per_slot_settings:
            downloader.per_slot_settings[key] = {
                "concurrency": self.limiter.exits[exit_id].limit,
                "delay": 0,
                "jitter": 0,
                "randomize_delay": False,
            }
        return key

    def _hand_back(self, request: Request) -> Request:
        self.stats.inc_value("exitlimit/requeued_on_close")
        return self._fresh_copy(request)

    @staticmethod
    def _fresh_copy(request: Request, **meta: Any) -> Request:
        new_meta = {k: v for k, v in request.meta.items() if k not in OWN_KEYS}
        new_meta.update(meta)
        return request.replace(meta=new_meta, dont_filter=True)

    # -- feedback ----------------------------------------------------------
    def _release(self, request: Request, answered: bool = False) -> None:
        lease_id = request.meta.pop(LEASE_KEY, None)
        if lease_id is not None and self.limiter.release(lease_id, answered) is not None:
            self.queue.wake()

    def _left_downloader(self, request: Request, spider: Any = None) -> None:
        self._release(request)

    def _response_downloaded(self, response: Response, request: Request,
                             spider: Any = None) -> None:
        """Feedback straight from the wire, before any other middleware reacts."""
        exit_id = request.meta.get("exitlimit_exit")
        if exit_id is None or LEASE_KEY not in request.meta:
            return
        self._feedback(request, response, exit_id)
        self._release(request, answered=True)

    def _feedback(self, request: Request, response: Response, exit_id: str) -> None:
        origin = origin_of(request)
        if response.status == 429:
            seconds = parse_retry_after(
                response.headers.get(b"Retry-After"),
                date=response.headers.get(b"Date"),
                now=time.time(),
            )
            cooldown = bounded_cooldown(
                seconds,
                floor=self.config.cooldown_min,
                cap=self.config.cooldown_max,
                default=self.config.cooldown_default,
            )
            until = self.limiter.rate_limited(origin, exit_id, cooldown)
            self.stats.inc_value("exitlimit/response_429")
            if self.config.stats_per_exit:
                self.stats.inc_value(f"exitlimit/exit/{exit_id}/response_429")
            logger.debug("exitlimit: 429 from %s via %s, cooling the pair for %.2fs",
                         origin, exit_id, until - self.limiter.clock())
        elif response.status < 400:
            self.limiter.succeeded(origin, exit_id)

    def process_response(self, request: Request, response: Response,
                         spider: Any = None) -> Request | Response:
        self._release(request)  # a cache hit never reaches the downloader
        if response.status != 429 or "exitlimit_exit" not in request.meta:
            return response
        retries = request.meta.get("exitlimit_retries", 0) + 1
        max_retries = request.meta.get("exitlimit_max_retries", self.config.max_retries)
        if retries <= max_retries:
            self.stats.inc_value("exitlimit/reissued")
            logger.debug("exitlimit: re-issuing %s after a 429 (%d/%d)",
                         request, retries, max_retries)
            return self._fresh_copy(request, exitlimit_retries=retries)
        self.stats.inc_value("exitlimit/gave_up")
        logger.warning("exitlimit: gave up on %s after %d rate-limited attempts; "
                       "passing the 429 on", request, retries)
        request.meta["dont_retry"] = True  # RetryMiddleware must not start over
        return response

    def process_exception(self, request: Request, exception: Exception,
                          spider: Any = None) -> None:
        self._release(request)
        return None
