"""One-line activation: ADDONS = {"scrapy_exitlimit.Addon": 100}."""

from __future__ import annotations

import logging
from typing import Any

from scrapy.settings import SETTINGS_PRIORITIES, BaseSettings

from .config import DEFAULT_CONCURRENCY, read_exit_urls

logger = logging.getLogger(__name__)

MIDDLEWARE = "scrapy_exitlimit.middleware.ExitLimitMiddleware"
#: after RetryMiddleware (550) and MetaRefresh (580), before HttpCompression (590)
#: and HttpProxyMiddleware (750): sees a 429 first, sets meta['proxy'] before it is read
MIDDLEWARE_ORDER = 585
#: parked requests count against CONCURRENT_REQUESTS: leave room for them
PARKING_ROOM = 16


def _user_set(settings: BaseSettings, name: str) -> bool:
    return (settings.getpriority(name) or 0) > SETTINGS_PRIORITIES["default"]


class Addon:
    def update_settings(self, settings: BaseSettings) -> None:
        settings.set("DOWNLOADER_MIDDLEWARES", {
            **settings.getdict("DOWNLOADER_MIDDLEWARES"),
            MIDDLEWARE: MIDDLEWARE_ORDER,
        }, priority="addon")
        # AutoThrottle would tune the delay of our per-exit slots against our pacing
        if not _user_set(settings, "AUTOTHROTTLE_ENABLED"):
            settings.set("AUTOTHROTTLE_ENABLED", False, priority="addon")
        elif settings.getbool("AUTOTHROTTLE_ENABLED"):
            logger.warning("AUTOTHROTTLE_ENABLED is on: it will pace only requests that "
                           "scrapy_exitlimit does not handle (dont_exitlimit)")
        self._size_concurrency(settings)

    @staticmethod
    def _size_concurrency(settings: BaseSettings) -> None:
        try:
            exits = len([u for u in read_exit_urls(settings.get("EXITLIMIT_EXITS"))
                         if u.strip() and not u.strip().startswith("#")])
        except ValueError:
            return  # the middleware reports bad configuration with the setting's name
        if not exits or not settings.getbool("EXITLIMIT_ENABLED", True):
            return
        per_exit = _int(settings.get("EXITLIMIT_CONCURRENCY"), DEFAULT_CONCURRENCY)
        capacity = exits * per_exit
        wanted = capacity + max(PARKING_ROOM, exits)
        if not _user_set(settings, "CONCURRENT_REQUESTS"):
            settings.set("CONCURRENT_REQUESTS", wanted, priority="addon")
        elif settings.getint("CONCURRENT_REQUESTS") < capacity:
            logger.warning(
                "CONCURRENT_REQUESTS (%d) is below the pool's capacity (%d exits x "
                "EXITLIMIT_CONCURRENCY %d = %d): some exits will sit idle; consider %d",
                settings.getint("CONCURRENT_REQUESTS"), exits, per_exit, capacity, wanted)


def _int(value: Any, default: int) -> int:
    try:
        return int(value) if value not in (None, "") else default
    except (TypeError, ValueError):
        return default
