"""Start-up checks of how the middleware is wired into a crawl, with warnings that say why.

- Its order: before HttpProxyMiddleware, which turns the credentials of the
  ``meta['proxy']`` it sets into a ``Proxy-Authorization`` header, and after
  RetryMiddleware, so it sees a 429 before RetryMiddleware retries it at once.
- Enabled through ``DOWNLOADER_MIDDLEWARES`` alone (no add-on): it works, and a warning
  lists what the add-on would have set, with the numbers.
- The download handler for http/https: only the add-on's checks at the last moment that
  a request leaves through the exit it was given.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy.utils.misc import load_object

from .addon import (
    DOWNLOAD_HANDLER,
    MIDDLEWARE,
    MIDDLEWARE_ORDER,
    START_MIDDLEWARE,
    Addon,
    pool_capacity,
)

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

HTTP_PROXY = "scrapy.downloadermiddlewares.httpproxy.HttpProxyMiddleware"
RETRY = "scrapy.downloadermiddlewares.retry.RetryMiddleware"


def _orders(settings: Any) -> dict[Any, Any]:
    """Every downloader middleware's effective order, keyed by class."""
    out: dict[Any, Any] = {}
    for key, order in settings.getwithbase("DOWNLOADER_MIDDLEWARES").items():
        try:
            out[load_object(key)] = order
        except (ImportError, NameError, ValueError, AttributeError):
            continue  # Scrapy reports it when it builds the chain
    return out


def order_problems(settings: Any) -> list[str]:
    """Why the middleware's place in DOWNLOADER_MIDDLEWARES would hurt, one line each."""
    orders = _orders(settings)
    ours = orders.get(load_object(MIDDLEWARE))
    if ours is None:
        return []
    problems = []
    proxy = orders.get(load_object(HTTP_PROXY))
    if proxy is not None and ours >= proxy:
        problems.append(
            f"ExitLimitMiddleware ({ours}) comes after HttpProxyMiddleware ({proxy}): the "
            "proxy credentials in the meta['proxy'] it sets are then never turned into a "
            f"Proxy-Authorization header; order it below {proxy} (the add-on uses "
            f"{MIDDLEWARE_ORDER})")
    retry = orders.get(load_object(RETRY))
    if retry is not None and ours <= retry:
        problems.append(
            f"ExitLimitMiddleware ({ours}) comes before RetryMiddleware ({retry}): "
            "RetryMiddleware then sees a 429 first and retries it at once, ignoring "
            f"Retry-After and spending RETRY_TIMES; order it above {retry} (the add-on "
            f"uses {MIDDLEWARE_ORDER})")
    return problems


def addon_loaded(crawler: Crawler) -> bool:
    addons = getattr(getattr(crawler, "addons", None), "addons", [])
    return any(isinstance(addon, Addon) for addon in addons)


def without_addon(settings: Any, exits: int, per_exit: int) -> str:
    """What the add-on would have set, against what is set (one warning)."""
    capacity, wanted = pool_capacity([per_exit] * exits)
    have = settings.getint("CONCURRENT_REQUESTS")
    handlers = settings.getwithbase("DOWNLOAD_HANDLERS")
    lines = [
        "ExitLimitMiddleware is enabled through DOWNLOADER_MIDDLEWARES without the add-on; "
        "ADDONS = {'scrapy_exitlimit.Addon': 100} would also have set:"]
    if have < wanted:
        why = (f"below the pool's capacity of {exits} exits x {per_exit} = {capacity}: exits "
               "will sit idle" if have < capacity else
               f"the pool's capacity of {exits} exits x {per_exit} = {capacity}, plus room for "
               "the requests parked here, which count against it")
        lines.append(f"CONCURRENT_REQUESTS = {wanted} (now {have}; {why})")
    if handlers.get("http") != DOWNLOAD_HANDLER or handlers.get("https") != DOWNLOAD_HANDLER:
        lines.append(f"DOWNLOAD_HANDLERS http/https = {DOWNLOAD_HANDLER} (connections kept "
                     "apart per proxy credential, and a last-moment check that each request "
                     "leaves through its exit)")
    if settings.getbool("AUTOTHROTTLE_ENABLED"):
        lines.append("AUTOTHROTTLE_ENABLED = False (it tunes the per-exit slots' delay "
                     "against this pacing)")
    lines.append("EXTENSIONS: scrapy_exitlimit.progress.ExitLimitProgress (the progress line)")
    lines.append(f"SPIDER_MIDDLEWARES: {START_MIDDLEWARE} (start requests read without holding "
                 "up the event loop)")
    return "\n  - ".join(lines)


def check_wiring(crawler: Crawler, exits: int, per_exit: int) -> None:
    """Log a warning for each way the crawl's wiring weakens the middleware."""
    settings = crawler.settings
    for problem in order_problems(settings):
        logger.warning("scrapy_exitlimit: %s", problem)
    if not addon_loaded(crawler):
        logger.warning("scrapy_exitlimit: %s", without_addon(settings, exits, per_exit))
        return
    handlers = settings.getwithbase("DOWNLOAD_HANDLERS")
    for scheme in ("http", "https"):
        if handlers.get(scheme) != DOWNLOAD_HANDLER:
            logger.warning("scrapy_exitlimit: DOWNLOAD_HANDLERS[%r] is your own handler: no "
                           "last-moment check that each %s request leaves through its exit",
                           scheme, scheme)
