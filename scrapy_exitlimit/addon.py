"""One-line activation: ADDONS = {"scrapy_exitlimit.Addon": 100}."""

from __future__ import annotations

import logging
from typing import Any

from scrapy.settings import SETTINGS_PRIORITIES, BaseSettings

from .config import DEFAULT_CONCURRENCY, read_exits

logger = logging.getLogger(__name__)

MIDDLEWARE = "scrapy_exitlimit.middleware.ExitLimitMiddleware"
#: after RetryMiddleware (550) and MetaRefresh (580), before HttpCompression (590)
#: and HttpProxyMiddleware (750): sees a 429 first, sets meta['proxy'] before it is read
MIDDLEWARE_ORDER = 585
#: parked requests count against CONCURRENT_REQUESTS: leave room for them
PARKING_ROOM = 16
PROGRESS = "scrapy_exitlimit.progress.ExitLimitProgress"
#: keeps apart keep-alive connections of exits that differ only in their credentials
DOWNLOAD_HANDLER = "scrapy_exitlimit.handlers.CredentialKeyedDownloadHandler"


def _user_set(settings: BaseSettings, name: str) -> bool:
    return (settings.getpriority(name) or 0) > SETTINGS_PRIORITIES["default"]


def _at_least_addon(settings: BaseSettings, name: str) -> int:
    """Priority for adding entries to a dict setting the user may have set too."""
    return max(settings.getpriority(name) or 0, SETTINGS_PRIORITIES["addon"])


class Addon:
    def update_settings(self, settings: BaseSettings) -> None:
        # at the priority of your own DOWNLOADER_MIDDLEWARES: at "addon" they would drop ours
        settings.set("DOWNLOADER_MIDDLEWARES", {
            **settings.getdict("DOWNLOADER_MIDDLEWARES"),
            MIDDLEWARE: MIDDLEWARE_ORDER,
        }, priority=_at_least_addon(settings, "DOWNLOADER_MIDDLEWARES"))
        # AutoThrottle would tune the delay of our per-exit slots against our pacing
        if not _user_set(settings, "AUTOTHROTTLE_ENABLED"):
            settings.set("AUTOTHROTTLE_ENABLED", False, priority="addon")
        elif settings.getbool("AUTOTHROTTLE_ENABLED"):
            logger.warning("AUTOTHROTTLE_ENABLED is on: it will pace only requests that "
                           "scrapy_exitlimit does not handle (dont_exitlimit)")
        self._size_concurrency(settings)
        self._install_handler(settings)
        # the progress line beside Scrapy's own LogStats (500), every LOGSTATS_INTERVAL
        settings.set("EXTENSIONS", {**settings.getdict("EXTENSIONS"), PROGRESS: 510},
                     priority=_at_least_addon(settings, "EXTENSIONS"))

    @staticmethod
    def _install_handler(settings: BaseSettings) -> None:
        """Our HTTP/1.1 handler for http and https, unless you chose one for the scheme."""
        if not settings.getbool("EXITLIMIT_ENABLED", True):
            return
        try:
            from . import handlers  # noqa: F401 - needs Scrapy's HTTP/1.1 handler internals
        except ImportError as exc:
            logger.warning("scrapy_exitlimit: cannot install %s (%s): exits that differ only "
                           "in credentials may share connections", DOWNLOAD_HANDLER, exc)
            return
        own = settings.getdict("DOWNLOAD_HANDLERS")
        chosen = {s: DOWNLOAD_HANDLER for s in ("http", "https") if s not in own}
        if chosen:  # at the priority of your own entries, which stay as they are
            settings.set("DOWNLOAD_HANDLERS", {**own, **chosen},
                         priority=_at_least_addon(settings, "DOWNLOAD_HANDLERS"))

    @staticmethod
    def _size_concurrency(settings: BaseSettings) -> None:
        try:
            exits = len(read_exits(settings, warn=False))  # gateway templates expanded
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
