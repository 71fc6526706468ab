"""EXITLIMIT_* settings, parsed and validated once. Errors name the setting."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scrapy.exceptions import NotConfigured

from .core import Exit, StaticLimits, parse_exit_list

logger = logging.getLogger(__name__)

#: Pair rate used while EXITLIMIT_RATE is unset: slow enough for most sites.
DEFAULT_PAIR_RATE = 1.0


def _number(settings: Any, name: str, *, integer: bool = False, minimum: float | None = None,
            strict: bool = False, optional: bool = False) -> Any:
    raw = settings.get(name)
    if raw is None or raw == "":
        if optional:
            return None
        raise ValueError(f"{name} must be set")
    try:
        value = int(raw) if integer and not isinstance(raw, float) else float(raw)
    except (TypeError, ValueError):
        raise ValueError(f"{name} ({raw!r}) must be a number") from None
    if integer and value != int(value):
        raise ValueError(f"{name} ({raw!r}) must be a whole number")
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"{name} ({raw!r}) must be finite")
    if minimum is not None and (value <= minimum if strict else value < minimum):
        relation = ">" if strict else ">="
        raise ValueError(f"{name} ({raw!r}) must be {relation} {minimum:g}")
    return int(value) if integer else value


def read_exit_urls(value: Any, name: str = "EXITLIMIT_EXITS") -> list[str]:
    """A list of proxy URLs, a comma/newline separated string of them, or a file path."""
    if value is None or value == "":
        return []
    if isinstance(value, str):
        if "://" in value:
            return [u for u in value.replace(",", "\n").split() if u]
        path = Path(value).expanduser()
        if not path.is_file():
            raise ValueError(f"{name} ({value!r}) is neither proxy URLs nor a readable file")
        return path.read_text().splitlines()
    if isinstance(value, (list, tuple)):
        return [str(u) for u in value]
    raise ValueError(f"{name} must be a list of proxy URLs or a path, got {type(value).__name__}")


def _overrides(settings: Any, name: str, allowed: set[str]) -> dict[str, dict[str, Any]]:
    raw = settings.getdict(name) if hasattr(settings, "getdict") else dict(settings.get(name) or {})
    out: dict[str, dict[str, Any]] = {}
    for key, spec in raw.items():
        if not isinstance(spec, Mapping):
            raise ValueError(f"{name}[{key!r}] must be a dict, got {type(spec).__name__}")
        unknown = set(spec) - allowed
        if unknown:
            raise ValueError(f"{name}[{key!r}]: unknown keys {sorted(unknown)}; "
                             f"allowed: {sorted(allowed)}")
        entry: dict[str, Any] = {}
        for k, v in spec.items():
            label = f"{name}[{key!r}][{k!r}]"
            integer = k in ("burst", "origin_burst", "concurrency")
            entry[k] = _number({label: v}, label, integer=integer, minimum=0 if not integer else 1,
                               strict=not integer, optional=k == "origin_rate")
        out[str(key)] = entry
    return out


@dataclass(frozen=True)
class ExitLimitConfig:
    exits: list[Exit]
    limits: StaticLimits
    rate_given: bool
    max_retries: int = 5
    cooldown_min: float = 0.5
    cooldown_default: float = 2.0
    cooldown_max: float = 600.0
    jitter: float = 0.1
    margin: float = 0.005
    stats_per_exit: bool = False
    lease_timeout: float = 240.0

    @classmethod
    def from_settings(cls, settings: Any) -> ExitLimitConfig:
        if not settings.getbool("EXITLIMIT_ENABLED", True):
            raise NotConfigured
        urls = read_exit_urls(settings.get("EXITLIMIT_EXITS"))
        try:
            exits = parse_exit_list(urls)
        except ValueError as exc:
            raise ValueError(f"EXITLIMIT_EXITS: {exc}") from None
        if not exits:
            raise NotConfigured("EXITLIMIT_EXITS is empty: give the proxy URLs to crawl through")
        ids_by_url = {ex.url: ex.id for ex in exits}
        exit_overrides = {
            ids_by_url.get(key, key): spec
            for key, spec in _overrides(settings, "EXITLIMIT_EXIT_SETTINGS",
                                        {"rate", "burst", "concurrency"}).items()
        }
        unknown = set(exit_overrides) - set(ids_by_url.values())
        if unknown:
            raise ValueError(f"EXITLIMIT_EXIT_SETTINGS names {len(unknown)} exit(s) "
                             "that are not in EXITLIMIT_EXITS")
        origin_overrides = _overrides(settings, "EXITLIMIT_ORIGIN_SETTINGS",
                                      {"rate", "burst", "origin_rate", "origin_burst"})
        rate = _number(settings, "EXITLIMIT_RATE", minimum=0, strict=True, optional=True)
        limits = StaticLimits(
            rate=rate if rate is not None else DEFAULT_PAIR_RATE,
            burst=_number(settings, "EXITLIMIT_BURST", integer=True, minimum=1, optional=True) or 1,
            concurrency=_number(settings, "EXITLIMIT_CONCURRENCY", integer=True, minimum=1,
                                optional=True) or 4,
            origin_rate=_number(settings, "EXITLIMIT_ORIGIN_RATE", minimum=0, strict=True,
                                optional=True),
            origin_burst=_number(settings, "EXITLIMIT_ORIGIN_BURST", integer=True, minimum=1,
                                 optional=True) or 1,
            origins={k.rstrip("/"): v for k, v in origin_overrides.items()},
            exits=exit_overrides,
        )
        opt = {
            "max_retries": ("EXITLIMIT_MAX_RETRIES", True, 0, False),
            "cooldown_min": ("EXITLIMIT_COOLDOWN_MIN", False, 0, False),
            "cooldown_default": ("EXITLIMIT_COOLDOWN_DEFAULT", False, 0, False),
            "cooldown_max": ("EXITLIMIT_COOLDOWN_MAX", False, 0, True),
            "jitter": ("EXITLIMIT_JITTER", False, 0, False),
            "margin": ("EXITLIMIT_SAFETY_MARGIN", False, 0, False),
        }
        values = {attr: _number(settings, name, integer=integer, minimum=minimum, strict=strict,
                                optional=True)
                  for attr, (name, integer, minimum, strict) in opt.items()}
        values = {k: v for k, v in values.items() if v is not None}
        config = cls(
            exits=exits,
            limits=limits,
            rate_given=rate is not None,
            stats_per_exit=settings.getbool("EXITLIMIT_STATS_PER_EXIT", False),
            lease_timeout=settings.getfloat("DOWNLOAD_TIMEOUT", 180) + 60,
            **values,
        )
        if config.cooldown_min > config.cooldown_max:
            raise ValueError(f"EXITLIMIT_COOLDOWN_MIN ({config.cooldown_min}) must not exceed "
                             f"EXITLIMIT_COOLDOWN_MAX ({config.cooldown_max})")
        return config
