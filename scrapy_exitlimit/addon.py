"""One-line activation: ADDONS = {"scrapy_exitlimit.Addon": 100}."""

from __future__ import annotations

import logging
from typing import Any

from scrapy.settings import SETTINGS_PRIORITIES, BaseSettings
from scrapy.utils.misc import load_object

from .config import exit_concurrency, no_exits_error, read_bool, read_exits, read_setting

logger = logging.getLogger(__name__)

MIDDLEWARE = "scrapy_exitlimit.middleware.ExitLimitMiddleware"
#: after RetryMiddleware (550) and MetaRefresh (580), before HttpCompression (590)
#: and HttpProxyMiddleware (750): sees a 429 first, sets meta['proxy'] before it is read
MIDDLEWARE_ORDER = 585
#: parked requests count against CONCURRENT_REQUESTS: leave room for them
PARKING_ROOM = 16
PROGRESS = "scrapy_exitlimit.progress.ExitLimitProgress"
#: beside Scrapy's own LogStats (500)
PROGRESS_ORDER = 510
#: keeps apart keep-alive connections of exits that differ only in their credentials, and
#: fails a request of ours that reaches it without the proxy it was given
DOWNLOAD_HANDLER = "scrapy_exitlimit.handlers.CredentialKeyedDownloadHandler"
#: reads start requests in slices, handing the event loop a turn between them (parked
#: requests fill the downloader, and Scrapy then reads every start request in one go);
#: outermost of the spider middlewares (before StartSpiderMiddleware, 25), so that the
#: time of every one inside it counts
START_MIDDLEWARE = "scrapy_exitlimit.start.CooperativeStartMiddleware"
START_MIDDLEWARE_ORDER = 10


def _user_set(settings: BaseSettings, name: str) -> bool:
    return (settings.getpriority(name) or 0) > SETTINGS_PRIORITIES["default"]


def _at_least_addon(settings: BaseSettings, name: str) -> int:
    """Priority for adding entries to a dict setting the user may have set too."""
    return max(settings.getpriority(name) or 0, SETTINGS_PRIORITIES["addon"])


def user_order(settings: BaseSettings, name: str, path: str) -> tuple[bool, Any]:
    """``(present, value)`` of the component ``path`` in the component priority dict
    ``name`` as the user wrote it (by path or by class)."""
    cls = load_object(path)
    for key, value in settings.getdict(name).items():
        if key == path or key is cls or (isinstance(key, str) and _loads_to(key, cls)):
            return True, value
    return False, None


def _loads_to(path: str, cls: type) -> bool:
    try:
        return load_object(path) is cls
    except (ImportError, NameError, ValueError, AttributeError):
        return False


class AddonConfigError(ValueError):
    """A setting contradicts the add-on being on."""


class Addon:
    """Adds what the middleware needs; whatever you set yourself stays as you set it.

    ``EXITLIMIT_ENABLED = False`` is the one off switch: then the add-on adds nothing.
    """

    def update_settings(self, settings: BaseSettings) -> None:
        if not read_bool(settings, "EXITLIMIT_ENABLED", True):
            return
        # fail closed: no exits would mean every request leaves from this machine
        exits = read_exits(settings, warn=False)  # gateway templates expanded
        if not exits:
            raise no_exits_error(settings)
        self._add_middleware(settings)
        # AutoThrottle would tune the delay of our per-exit slots against our pacing
        if not _user_set(settings, "AUTOTHROTTLE_ENABLED"):
            settings.set("AUTOTHROTTLE_ENABLED", False, priority="addon")
        elif settings.getbool("AUTOTHROTTLE_ENABLED"):
            logger.warning("AUTOTHROTTLE_ENABLED is on: it will pace only requests that "
                           "scrapy_exitlimit does not handle (dont_exitlimit)")
        self._size_concurrency(settings, exits)
        self._install_handler(settings)
        # the progress line beside LogStats, every LOGSTATS_INTERVAL; your None turns it off
        settings.setdefault_in_component_priority_dict("EXTENSIONS", load_object(PROGRESS),
                                                       PROGRESS_ORDER)
        # your None in SPIDER_MIDDLEWARES turns it off
        settings.setdefault_in_component_priority_dict(
            "SPIDER_MIDDLEWARES", load_object(START_MIDDLEWARE), START_MIDDLEWARE_ORDER)

    @staticmethod
    def _add_middleware(settings: BaseSettings) -> None:
        """At 585 unless you placed it yourself (wiring.check_order warns about odd places)."""
        present, order = user_order(settings, "DOWNLOADER_MIDDLEWARES", MIDDLEWARE)
        if present and order is None:
            raise AddonConfigError(
                f"DOWNLOADER_MIDDLEWARES sets {MIDDLEWARE} to None while the add-on is on: "
                "requests would leave without an exit. Turn scrapy_exitlimit off with "
                "EXITLIMIT_ENABLED = False (and nothing else).")
        if not present:
            settings.setdefault_in_component_priority_dict(
                "DOWNLOADER_MIDDLEWARES", load_object(MIDDLEWARE), MIDDLEWARE_ORDER)

    @staticmethod
    def _install_handler(settings: BaseSettings) -> None:
        """Our HTTP/1.1 handler for http and https, unless you chose one for the scheme."""
        own = settings.getdict("DOWNLOAD_HANDLERS")
        chosen = {s: DOWNLOAD_HANDLER for s in ("http", "https") if s not in own}
        if chosen:  # at the priority of your own entries, which stay as they are
            settings.set("DOWNLOAD_HANDLERS", {**own, **chosen},
                         priority=_at_least_addon(settings, "DOWNLOAD_HANDLERS"))

    @staticmethod
    def _size_concurrency(settings: BaseSettings, exits: list[Any]) -> None:
        per_exit = read_setting(settings, "EXITLIMIT_CONCURRENCY")
        caps = exit_concurrency(settings, exits, per_exit)  # EXITLIMIT_EXIT_SETTINGS too
        capacity, wanted = pool_capacity(caps)
        if not _user_set(settings, "CONCURRENT_REQUESTS"):
            settings.set("CONCURRENT_REQUESTS", wanted, priority="addon")
        elif settings.getint("CONCURRENT_REQUESTS") < capacity:
            logger.warning(
                "CONCURRENT_REQUESTS (%d) is below the pool's capacity (%d exits, "
                "EXITLIMIT_CONCURRENCY %d and EXITLIMIT_EXIT_SETTINGS: %d): some exits will "
                "sit idle; consider %d",
                settings.getint("CONCURRENT_REQUESTS"), len(exits), per_exit, capacity, wanted)


def pool_capacity(caps: list[int]) -> tuple[int, int]:
    """``(capacity, CONCURRENT_REQUESTS to use)`` for exits with these caps: the pool's
    in-flight capacity, plus room for the requests parked here, which count against
    CONCURRENT_REQUESTS too."""
    capacity = sum(caps)
    return capacity, capacity + max(PARKING_ROOM, len(caps))

