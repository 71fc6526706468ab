"""EXITLIMIT_* settings, parsed and validated once. Errors name the setting."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scrapy.exceptions import NotConfigured

from .core import Exit, Limits, Tuning, mask_url, parse_exit_list, parse_sessions
from .core.exits import SESSION_FIELD, is_template

logger = logging.getLogger(__name__)

#: ceiling of each exit's adaptive in-flight limit
DEFAULT_CONCURRENCY = 8
DEFAULT_POLICY = "scrapy_exitlimit.policy.ResponsePolicy"


def _number(settings: Any, name: str, *, integer: bool = False, minimum: float | None = None,
            strict: bool = False, optional: bool = False) -> Any:
    raw = settings.get(name)
    if raw is None or raw == "":
        if optional:
            return None
        raise ValueError(f"{name} must be set")
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ValueError(f"{name} ({_short(raw)}) must be a number") from None
    except OverflowError:  # an int beyond what a float holds
        raise ValueError(f"{name} must be finite") from None
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"{name} ({_short(raw)}) must be finite")
    if integer:
        try:
            exact = int(raw) if not isinstance(raw, float) else int(value)
        except (TypeError, ValueError):
            exact = None
        if exact is None or exact != value:
            raise ValueError(f"{name} ({_short(raw)}) must be a whole number")
        value = exact
    if minimum is not None and (value <= minimum if strict else value < minimum):
        relation = ">" if strict else ">="
        raise ValueError(f"{name} ({raw!r}) must be {relation} {minimum:g}")
    return int(value) if integer else value


def _short(raw: Any) -> str:
    text = repr(raw)
    return text if len(text) <= 40 else text[:37] + "..."


def read_exit_urls(value: Any, name: str = "EXITLIMIT_EXITS") -> list[str]:
    """A list of proxy URLs, a comma/newline separated string of them, or a file path."""
    if value is None or value == "":
        return []
    if isinstance(value, str):
        if "://" in value:
            return [u for u in value.replace(",", "\n").split() if u]
        try:
            path = Path(value).expanduser()
            if path.is_file():
                return path.read_text().splitlines()
        except (OSError, RuntimeError, ValueError) as exc:  # ~nobody, a NUL, too long
            raise ValueError(f"{name} ({_short(value)}) cannot be read: "
                             f"{type(exc).__name__}") from None
        raise ValueError(f"{name} ({_short(value)}) is neither proxy URLs nor a readable file")
    if isinstance(value, (list, tuple)):
        return [str(u) for u in value]
    raise ValueError(f"{name} must be a list of proxy URLs or a path, got {type(value).__name__}")


def read_exits(settings: Any, *, warn: bool = True) -> list[Exit]:
    """EXITLIMIT_EXITS as exits, each ``{session}`` template expanded once per
    EXITLIMIT_SESSIONS (a count N: sessions 1..N, or a list of names)."""
    urls = read_exit_urls(settings.get("EXITLIMIT_EXITS"))
    try:
        sessions = parse_sessions(settings.get("EXITLIMIT_SESSIONS"))
    except ValueError as exc:
        raise ValueError(f"EXITLIMIT_SESSIONS {exc}") from None
    templates = sum(1 for u in urls if is_template(u))
    if templates and sessions is None:
        raise ValueError(f"EXITLIMIT_EXITS has {templates} gateway template(s) with "
                         f"{SESSION_FIELD} but EXITLIMIT_SESSIONS is not set: give a count "
                         "of sessions or a list of session names")
    if warn and sessions is not None and not templates:
        logger.warning("EXITLIMIT_SESSIONS is set but no EXITLIMIT_EXITS entry has "
                       "%s: it is ignored", SESSION_FIELD)
    try:
        return parse_exit_list(urls, sessions)
    except ValueError as exc:
        raise ValueError(f"EXITLIMIT_EXITS: {exc}") from None


def _overrides(settings: Any, name: str, allowed: set[str]) -> dict[str, dict[str, Any]]:
    try:
        raw = settings.getdict(name) if hasattr(settings, "getdict") else dict(
            settings.get(name) or {})
    except (TypeError, ValueError):  # a string that is not JSON, a list, a number
        raise ValueError(f"{name} must be a dict of {{key: {{setting: value}}}}") from None
    out: dict[str, dict[str, Any]] = {}
    for key, spec in raw.items():
        shown = mask_url(str(key))  # keyed by proxy URL, the key may hold a password
        if not isinstance(spec, Mapping):
            raise ValueError(f"{name}[{shown!r}] must be a dict, got {type(spec).__name__}")
        unknown = {str(k) for k in spec} - allowed
        if unknown:
            raise ValueError(f"{name}[{shown!r}]: unknown keys {sorted(unknown)}; "
                             f"allowed: {sorted(allowed)}")
        entry: dict[str, Any] = {}
        for k, v in spec.items():
            label = f"{name}[{shown!r}][{k!r}]"
            integer = k in ("burst", "origin_burst", "concurrency")
            entry[k] = _number({label: v}, label, integer=integer, minimum=0 if not integer else 1,
                               strict=not integer, optional=k == "origin_rate")
        out[str(key)] = entry
    return out


#: attribute -> (setting, integer?, minimum, strictly greater?, default)
_TUNING = {
    "margin": ("EXITLIMIT_SAFETY_MARGIN", False, 0, False, 0.005),
    "jitter": ("EXITLIMIT_JITTER", False, 0, False, 0.1),
    "start_rate": ("EXITLIMIT_START_RATE", False, 0, True, 2.0),
    "max_rate": ("EXITLIMIT_MAX_RATE", False, 0, True, 1000.0),
    "min_rate": ("EXITLIMIT_MIN_RATE", False, 0, True, 0.05),
    "breaker_after": ("EXITLIMIT_BREAKER_THRESHOLD", True, 1, False, 5),
    "breaker_cooldown": ("EXITLIMIT_BREAKER_COOLDOWN", False, 0, False, 30.0),
    "ban_cooldown": ("EXITLIMIT_BAN_COOLDOWN", False, 0, False, 300.0),
    "evict_after": ("EXITLIMIT_EVICT_AFTER", True, 1, False, 3),
    "reanimate_after": ("EXITLIMIT_REANIMATE_AFTER", False, 0, False, 10.0),
}
_GLUE = {
    "max_retries": ("EXITLIMIT_MAX_RETRIES", True, 0, False, 8),
    "cooldown_min": ("EXITLIMIT_COOLDOWN_MIN", False, 0, False, 0.5),
    "cooldown_default": ("EXITLIMIT_COOLDOWN_DEFAULT", False, 0, False, 2.0),
    "cooldown_max": ("EXITLIMIT_COOLDOWN_MAX", False, 0, True, 600.0),
    "stall_timeout": ("EXITLIMIT_STALL_TIMEOUT", False, 0, True, 120.0),
}


def _read_table(settings: Any, table: dict[str, tuple[str, bool, float, bool, Any]]
                ) -> dict[str, Any]:
    out = {}
    for attr, (name, integer, minimum, strict, default) in table.items():
        value = _number(settings, name, integer=integer, minimum=minimum, strict=strict,
                        optional=True)
        out[attr] = default if value is None else value
    return out


@dataclass(frozen=True)
class ExitLimitConfig:
    exits: list[Exit]
    limits: Limits
    tuning: Tuning
    # the _GLUE settings (their defaults live in that table only)
    max_retries: int
    cooldown_min: float
    cooldown_default: float
    cooldown_max: float
    stall_timeout: float
    stats_per_exit: bool
    debug: bool
    lease_timeout: float
    policy: str
    backend: str = "memory"
    #: a response header in which the provider names the exit's IP (None: not used)
    exit_ip_header: str | None = None

    @property
    def rate_given(self) -> bool:
        return self.limits.rate is not None

    @classmethod
    def from_settings(cls, settings: Any) -> ExitLimitConfig:
        if not settings.getbool("EXITLIMIT_ENABLED", True):
            raise NotConfigured
        exits = read_exits(settings)
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
        limits = Limits(
            rate=_number(settings, "EXITLIMIT_RATE", minimum=0, strict=True, optional=True),
            burst=_number(settings, "EXITLIMIT_BURST", integer=True, minimum=1, optional=True) or 1,
            concurrency=_number(settings, "EXITLIMIT_CONCURRENCY", integer=True, minimum=1,
                                optional=True) or DEFAULT_CONCURRENCY,
            origin_rate=_number(settings, "EXITLIMIT_ORIGIN_RATE", minimum=0, strict=True,
                                optional=True),
            origin_burst=_number(settings, "EXITLIMIT_ORIGIN_BURST", integer=True, minimum=1,
                                 optional=True) or 1,
            origins={k.rstrip("/"): v for k, v in origin_overrides.items()},
            exits=exit_overrides,
        )
        tuning = Tuning(**_read_table(settings, _TUNING))
        if tuning.min_rate > tuning.max_rate:
            raise ValueError(f"EXITLIMIT_MIN_RATE ({tuning.min_rate}) must not exceed "
                             f"EXITLIMIT_MAX_RATE ({tuning.max_rate})")
        glue = _read_table(settings, _GLUE)
        policy = settings.get("EXITLIMIT_POLICY") or DEFAULT_POLICY
        if not isinstance(policy, str):
            policy = f"{policy.__module__}.{policy.__qualname__}"
        backend = settings.get("EXITLIMIT_BACKEND") or "memory"
        if not isinstance(backend, str):
            backend = f"{backend.__module__}.{backend.__qualname__}"
        header = settings.get("EXITLIMIT_EXIT_IP_HEADER") or None
        if header is not None and (not isinstance(header, str) or not header.strip()
                                   or any(c in header for c in " :\r\n")):
            raise ValueError(f"EXITLIMIT_EXIT_IP_HEADER ({header!r}) must be a header name")
        config = cls(
            exit_ip_header=header,
            backend=backend,
            exits=exits,
            limits=limits,
            tuning=tuning,
            stats_per_exit=settings.getbool("EXITLIMIT_STATS_PER_EXIT", False),
            debug=settings.getbool("EXITLIMIT_DEBUG", False),
            lease_timeout=settings.getfloat("DOWNLOAD_TIMEOUT", 180) + 60,
            policy=policy,
            **glue,
        )
        if config.cooldown_min > config.cooldown_max:
            raise ValueError(f"EXITLIMIT_COOLDOWN_MIN ({config.cooldown_min}) must not exceed "
                             f"EXITLIMIT_COOLDOWN_MAX ({config.cooldown_max})")
        return config
