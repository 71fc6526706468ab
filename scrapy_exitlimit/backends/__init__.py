"""Where pair, exit and origin state lives: this process (memory) or Redis (shared)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy.utils.misc import load_object

from .base import Admission, Backend, MemoryBackend

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from ..config import ExitLimitConfig

#: short names EXITLIMIT_BACKEND accepts besides a class path
ALIASES = {
    "memory": "scrapy_exitlimit.backends.base.MemoryBackend",
    "redis": "scrapy_exitlimit.backends.redis.RedisBackend",
}


def load_backend(crawler: Crawler, config: ExitLimitConfig) -> Backend:
    path = config.backend
    try:
        cls = load_object(ALIASES.get(path, path))
    except (ImportError, NameError, ValueError, AttributeError) as exc:
        hint = " (pip install 'scrapy-exitlimit[redis]')" if path == "redis" else ""
        raise ValueError(f"EXITLIMIT_BACKEND ({path}) cannot be loaded: {exc}{hint}") from None
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise ValueError(f"EXITLIMIT_BACKEND ({path}) must name a Backend subclass "
                         "(scrapy_exitlimit.backends.Backend)")
    return cls.from_crawler(crawler, config)


__all__ = ["ALIASES", "Admission", "Backend", "MemoryBackend", "load_backend"]
