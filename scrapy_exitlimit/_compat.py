"""Every use of a Scrapy or Twisted name that is private, undocumented, or not the same in
every supported Scrapy version, in one place.

Supported: Scrapy 2.13.4 to 2.19 (setup.cfg), Twisted 23.10 on. Each entry says what it
relies on and where it was checked: "read" means the source of Scrapy 2.13.4, 2.14.2,
2.15.2, 2.16.0, 2.17.0, 2.18.0 and 2.19.0 was read for it; CI runs the whole suite on the
lowest supported Scrapy and Twisted and on the newest (.ci/run), so an API that moves
fails there first. Where a public API does the job, it is used instead, and named here
so nobody reaches for the private one again:

- the HttpCache middleware's instance: ``Crawler.get_downloader_middleware`` (2.12+);
- injecting a request from a signal handler: ``ExecutionEngine.crawl`` (all versions);
- Twisted's ``ResponseFailed`` / ``ResponseNeverReceived``: ``twisted.web.client``
  (not ``twisted.web._newclient``).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scrapy import exceptions as _scrapy_exceptions
from scrapy.core.downloader.handlers.http11 import HTTP11DownloadHandler

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.downloadermiddlewares.httpcache import HttpCacheMiddleware

__all__ = [
    "HANDLER_IS_ASYNC",
    "apply_settings",
    "call_later",
    "close_spider",
    "download_exceptions",
    "downloader_total",
    "engine_closing",
    "handler_pool",
    "is_asyncio_available",
    "looping_call",
    "served_from_cache",
    "set_downloader_total",
    "set_handler_pool",
    "set_idle_heartbeat",
    "set_slot_settings",
    "sleep",
]


# -- timers and loops (public API since Scrapy 2.14; the reactor before) -------------------

try:  # Scrapy >= 2.14: a timer on whatever loop runs (asyncio, or the Twisted reactor)
    from scrapy.utils.asyncio import call_later, is_asyncio_available
except ImportError:  # Scrapy 2.13
    from scrapy.utils.reactor import is_asyncio_reactor_installed as is_asyncio_available

    def call_later(delay: float, func: Callable[..., Any], *args: Any) -> Any:  # type: ignore[misc]
        from twisted.internet import reactor

        return reactor.callLater(delay, func, *args)


try:  # Scrapy >= 2.18: asyncio.sleep or deferLater, whichever loop runs
    from scrapy.utils.asyncio import sleep
except ImportError:  # Scrapy 2.13-2.17: the same, here

    async def sleep(seconds: float) -> None:  # type: ignore[misc]
        if is_asyncio_available():
            await asyncio.sleep(seconds)
            return
        from twisted.internet import reactor
        from twisted.internet.task import deferLater

        await deferLater(reactor, seconds)


def looping_call(func: Callable[[], Any]) -> Any:
    """A LoopingCall-like object (``start(interval)``, ``stop()``, ``running``): an
    asyncio task under the asyncio reactor on Scrapy >= 2.14, Twisted's before."""
    try:
        from scrapy.utils.asyncio import create_looping_call
    except ImportError:  # Scrapy 2.13
        from twisted.internet.task import LoopingCall

        return LoopingCall(func)
    return create_looping_call(func)


async def close_spider(crawler: Crawler, reason: str) -> None:
    """Close the crawler's spider with ``reason`` (public API; renamed in 2.14)."""
    from scrapy.utils.defer import maybe_deferred_to_future

    engine = crawler.engine
    assert engine is not None
    if hasattr(engine, "close_spider_async"):  # 2.14+ (close_spider warns there)
        await engine.close_spider_async(reason=reason)
    else:  # 2.13
        await maybe_deferred_to_future(engine.close_spider(crawler.spider, reason))


def download_exceptions(*names: str) -> tuple[type[BaseException], ...]:
    """The Scrapy exceptions of these names that this Scrapy has. Since 2.15 Scrapy wraps
    Twisted's download errors in its own (``DownloadTimeoutError``,
    ``DownloadConnectionRefusedError``, ``DownloadFailedError``, ``ResponseDataLossError``);
    before, the Twisted ones reach the middlewares unwrapped, so callers list both.
    Read: 2.13.4-2.19.0."""
    return tuple(getattr(_scrapy_exceptions, n) for n in names
                 if isinstance(getattr(_scrapy_exceptions, n, None), type))


# -- the engine ----------------------------------------------------------------------------


def engine_closing(crawler: Crawler) -> bool:
    """The engine is stopping or closing the spider.

    Private: ``ExecutionEngine._slot`` and its ``closing`` Deferred, set when
    ``close_spider`` starts waiting for requests in progress (parked ones included) and
    before any signal fires; ``engine.running`` (public) only covers ``stop()``. No public
    equivalent: ``needs_backout()`` is also true when the downloader is merely full, as it
    is whenever requests are parked. Read: 2.13.4-2.19.0 (same attribute and meaning).
    """
    engine = crawler.engine
    if engine is None or not engine.running:
        return True
    slot = getattr(engine, "_slot", None)
    return slot is None or slot.closing is not None


def set_idle_heartbeat(crawler: Crawler, seconds: float) -> None:
    """How often an idle engine looks at its scheduler (Scrapy: every 5 s).

    Private: the class attribute ``ExecutionEngine._SLOT_HEARTBEAT_INTERVAL``, read when
    the engine starts processing requests, after ``engine_started`` fires: set it from an
    ``engine_started`` handler. No public setting. Read: 2.13.4-2.19.0 (5.0 in each).
    """
    engine = crawler.engine
    assert engine is not None
    engine._SLOT_HEARTBEAT_INTERVAL = seconds  # type: ignore[attr-defined]


# -- the downloader ------------------------------------------------------------------------


def set_slot_settings(crawler: Crawler, key: str, concurrency: int) -> None:
    """Give download slot ``key`` its own concurrency and no delay, if it has none yet.

    Undocumented: ``Downloader.per_slot_settings``, the ``DOWNLOAD_SLOTS`` setting as read
    at start, consulted whenever a slot is created (also after the slot garbage collector
    dropped an idle one). DOWNLOAD_SLOTS itself is public, but it is frozen before any
    component runs, and the slots here are one per exit, known only once the middleware
    has parsed its exits. Delay randomization is off under both of its names: ``jitter``
    (2.19+) and ``randomize_delay`` (before; 2.19 reads it only when ``jitter`` is
    absent, so it does not warn). Read: 2.13.4-2.19.0.
    """
    engine = crawler.engine
    assert engine is not None
    table = engine.downloader.per_slot_settings
    if key not in table:
        table[key] = {"concurrency": concurrency, "delay": 0, "jitter": 0,
                      "randomize_delay": False}


def downloader_total(crawler: Crawler) -> tuple[int, int] | None:
    """``(held, total)``: the requests the downloader holds (parked ones included: its
    ``active`` set, public in the telnet console's ``est()``), and how many it may hold
    before the engine stops handing it more (see ``set_downloader_total``; 0: no
    limit). None before the engine exists."""
    engine = crawler.engine
    if engine is None:
        return None
    downloader = engine.downloader
    return len(downloader.active), downloader.total_concurrency


def set_downloader_total(crawler: Crawler, total: int) -> None:
    """Hold at most ``total`` requests in the downloader, parked ones included.

    Undocumented: ``Downloader.total_concurrency``, CONCURRENT_REQUESTS as read at start,
    which ``Downloader.needs_backout`` compares with the requests it holds (its
    ``active`` set) each time the engine is about to hand it another; 2.18+ read 0 as no
    limit. No public API changes it while crawling. Read: 2.13.4-2.19.0.
    """
    engine = crawler.engine
    assert engine is not None
    engine.downloader.total_concurrency = total


def served_from_cache(cache: HttpCacheMiddleware, request: Request, crawler: Crawler) -> bool:
    """``HttpCacheMiddleware.process_request`` will answer ``request`` from the cache.

    Asks the cache's policy and storage the questions its ``process_request`` asks, in
    its order. Undocumented: the middleware's ``policy``, ``storage`` and
    ``ignore_missing`` attributes (the policy and storage interfaces themselves are
    documented: ``should_cache_request``, ``retrieve_response(spider, request)``,
    ``is_cached_response_fresh``). Read: 2.13.4-2.19.0 (same attributes and order).
    """
    if request.meta.get("dont_cache"):
        return False
    if cache.ignore_missing:
        return True  # nothing leaves the process: a miss is dropped by the cache
    try:
        if not cache.policy.should_cache_request(request):
            return False
        cached = cache.storage.retrieve_response(crawler.spider, request)
        return cached is not None and cache.policy.is_cached_response_fresh(cached, request)
    except Exception:  # the cache logs its own read errors; for us it is a miss
        return False


# -- the HTTP/1.1 download handler ---------------------------------------------------------

#: Scrapy 2.14 changed the download handler API: ``__init__(crawler)`` and
#: ``async def download_request(request)``; before, ``__init__(settings, crawler)`` and
#: ``download_request(request, spider)`` returning a Deferred. Public (the handler API).
HANDLER_IS_ASYNC: bool = inspect.iscoroutinefunction(HTTP11DownloadHandler.download_request)


def handler_pool(handler: HTTP11DownloadHandler) -> Any:
    """The handler's keep-alive pool (a ``twisted.web.client.HTTPConnectionPool``).

    Private: ``HTTP11DownloadHandler._pool``, created in ``__init__`` and handed to the
    agent of every request (``ScrapyAgent``, ``_ScrapyAgent`` since 2.16), which asks it
    for a connection with ``getConnection(key, endpoint)`` synchronously, inside the
    handler's ``download_request`` (Twisted's ``Agent.request``). Read: 2.13.4-2.19.0.
    """
    return handler._pool  # type: ignore[attr-defined]


def set_handler_pool(handler: HTTP11DownloadHandler, pool: Any) -> None:
    handler._pool = pool  # type: ignore[attr-defined]


# -- tests ---------------------------------------------------------------------------------


def apply_settings(crawler: Crawler) -> None:
    """Run the crawler's add-ons and settings updates now, as ``crawl()`` does first (for
    tests of what the add-on sets). Private: ``Crawler._apply_settings``, idempotent.
    Read: 2.13.4-2.19.0."""
    crawler._apply_settings()  # type: ignore[attr-defined]
