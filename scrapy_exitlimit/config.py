"""EXITLIMIT_* settings, parsed and validated once. Errors name the setting."""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scrapy.exceptions import NotConfigured
from scrapy.settings import SETTINGS_PRIORITIES

from .core import Exit, Limits, Tuning, mask_url, parse_exit_list, parse_sessions
from .core.exits import SESSION_FIELD, is_template, with_scheme
from .core.health import BUSY_ROOM
from .core.limits import CRAWL_TUNING
from .core.scopes import ScopeRules

logger = logging.getLogger(__name__)

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


class NoExits(ValueError):
    """The package is on (EXITLIMIT_ENABLED) but EXITLIMIT_EXITS names no exit: crawling
    on would send every request from this machine's own address, so the crawl stops."""


def _is_url_list(text: str) -> bool:
    words = text.replace(",", "\n").split()
    return bool(words) and all("://" in w or with_scheme(w) != w for w in words)


def read_exit_urls(value: Any, name: str = "EXITLIMIT_EXITS") -> list[str]:
    """A list of proxy URLs, a comma/newline separated string of them, or a file path.

    ``host:port`` entries are left as they are (:func:`core.exits.with_scheme` reads
    them as ``http://host:port``)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return []
    if isinstance(value, str):
        if "://" in value or (_is_url_list(value) and not _is_file(value)):
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


def _is_file(value: str) -> bool:
    try:
        return Path(value).expanduser().is_file()
    except (OSError, RuntimeError, ValueError):
        return False


def setting_source(settings: Any, name: str) -> str:
    """Where a setting's value came from, in words (``project settings``, ...)."""
    priority = settings.getpriority(name) if hasattr(settings, "getpriority") else None
    if priority is None:
        return "not set"
    names = {v: k for k, v in SETTINGS_PRIORITIES.items()}
    words = {"default": "Scrapy's defaults", "command": "the command's defaults",
             "addon": "an add-on", "project": "the project settings (or a SCRAPY_ variable)",
             "spider": "the spider's custom_settings", "cmdline": "the command line (-s)"}
    label = names.get(priority)
    return words.get(label, f"settings at priority {priority}") if label else \
        f"settings at priority {priority}"


def describe_exits_source(settings: Any) -> str:
    """What EXITLIMIT_EXITS was and where it came from, without its contents (they may
    hold credentials): ``an empty list, from the spider's custom_settings``."""
    value = settings.get("EXITLIMIT_EXITS")
    if value is None:
        return "not set (in no settings file, custom_settings or -s option)"
    if isinstance(value, str) and not value.strip():
        what = "an empty string (an empty environment variable?)"
    elif isinstance(value, str) and "://" not in value and _is_file(value):
        what = f"the file {value!r}, which has no exit lines (only blanks or # comments)"
    elif isinstance(value, (list, tuple)) and not value:
        what = "an empty list"
    else:
        what = f"a {type(value).__name__} with no exit in it (only blanks or # comments)"
    return f"{what}, from {setting_source(settings, 'EXITLIMIT_EXITS')}"


def no_exits_error(settings: Any) -> NoExits:
    return NoExits(
        f"EXITLIMIT_EXITS is {describe_exits_source(settings)}: with no exits every request "
        "would leave from this machine's own address, so the crawl stops before its first "
        "request. Give the proxy URLs to crawl through, or set EXITLIMIT_ENABLED = False "
        "to crawl without scrapy_exitlimit.")


#: where the id key lives when EXITLIMIT_ID_KEY is unset (created once, mode 0600)
ID_KEY_FILE = "scrapy-exitlimit/id-key"
_process_key: bytes | None = None


def id_key_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / ID_KEY_FILE


def id_key(settings: Any) -> bytes:
    """The key exit ids are an HMAC under (see core/exits.py).

    ``EXITLIMIT_ID_KEY`` when set: give every process of a deployment the same one, and
    ids agree across machines. Otherwise a random key kept in
    ``$XDG_CONFIG_HOME/scrapy-exitlimit/id-key`` (``~/.config/...``), created at first use:
    ids agree across the runs and processes of one machine user. If it cannot be read or
    created, a key drawn for this process only (ids then change from run to run).
    """
    value = settings.get("EXITLIMIT_ID_KEY")
    if value not in (None, ""):
        if isinstance(value, bytes):
            value = value.decode("utf-8", "surrogateescape")
        if not isinstance(value, str) or len(value.strip()) < 16:
            raise ValueError("EXITLIMIT_ID_KEY must be a string of at least 16 characters "
                             "(make one with openssl rand -hex 16)")
        return value.strip().encode("utf-8", "surrogateescape")
    return _key_from_file()


def _key_from_file() -> bytes:
    global _process_key
    path = id_key_path()
    try:
        key = path.read_bytes().strip()
        if len(key) >= 16:
            return key
    except OSError:
        pass
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(32).hex().encode())
        try:
            os.link(tmp, path)  # atomic, and never over a key another process just made
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
        key = path.read_bytes().strip()
        if len(key) >= 16:
            return key
    except OSError as exc:
        if _process_key is None:
            logger.warning("scrapy_exitlimit: cannot keep the exit id key in %s (%s): ids of "
                           "exits with credentials will differ between runs; set "
                           "EXITLIMIT_ID_KEY", path, exc.strerror or exc)
    if _process_key is None:
        _process_key = os.urandom(32)
    return _process_key


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
        return parse_exit_list(urls, sessions, key=id_key(settings))
    except ValueError as exc:
        if str(exc).startswith("EXITLIMIT_"):
            raise
        sep = " " if str(exc).startswith("entry #") else ": "
        raise ValueError(f"EXITLIMIT_EXITS{sep}{exc}") from None


def exit_concurrency(settings: Any, exits: Sequence[Exit], default: int) -> list[int]:
    """Each exit's in-flight cap: its EXITLIMIT_EXIT_SETTINGS concurrency, else ``default``
    (a malformed EXITLIMIT_EXIT_SETTINGS counts as none: the config reports it)."""
    try:
        raw = _overrides(settings, "EXITLIMIT_EXIT_SETTINGS", {"rate", "burst", "concurrency"})
    except ValueError:
        raw = {}
    ids_by_url = {ex.url: ex.id for ex in exits}
    caps = {ids_by_url.get(with_scheme(key), key): spec.get("concurrency")
            for key, spec in raw.items()}
    return [caps.get(ex.id) or default for ex in exits]


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


# -- the settings table -------------------------------------------------------------------
# Every EXITLIMIT_* setting with a value of its own is read here, once, with an error that
# names it; components get the parsed values from ExitLimitConfig (or read_setting), never
# the raw setting. Defaults come from the core's own dataclasses where it has one, so each
# is written in one place: Limits, Tuning (whose eviction defaults are ExitHealth's), and
# CRAWL_TUNING for the margin and jitter a crawl adds to the core's exact arithmetic.

_LIMITS_DEFAULTS = Limits()
_TUNING_DEFAULTS = {**vars(Tuning()), **CRAWL_TUNING}

#: numbers: attribute -> (setting, integer?, minimum, strictly greater?, default)
_LIMITS = {
    "rate": ("EXITLIMIT_RATE", False, 0, True, _LIMITS_DEFAULTS.rate),
    "burst": ("EXITLIMIT_BURST", True, 1, False, _LIMITS_DEFAULTS.burst),
    "concurrency": ("EXITLIMIT_CONCURRENCY", True, 1, False, _LIMITS_DEFAULTS.concurrency),
    "origin_rate": ("EXITLIMIT_ORIGIN_RATE", False, 0, True, _LIMITS_DEFAULTS.origin_rate),
    "origin_burst": ("EXITLIMIT_ORIGIN_BURST", True, 1, False, _LIMITS_DEFAULTS.origin_burst),
}
_TUNING = {
    attr: (name, integer, minimum, strict, _TUNING_DEFAULTS[attr])
    for attr, (name, integer, minimum, strict) in {
        "margin": ("EXITLIMIT_SAFETY_MARGIN", False, 0, False),
        "jitter": ("EXITLIMIT_JITTER", False, 0, False),
        "start_rate": ("EXITLIMIT_START_RATE", False, 0, True),
        "start_leap": ("EXITLIMIT_START_LEAP", False, 0, True),
        "max_rate": ("EXITLIMIT_MAX_RATE", False, 0, True),
        "min_rate": ("EXITLIMIT_MIN_RATE", False, 0, True),
        "breaker_after": ("EXITLIMIT_BREAKER_THRESHOLD", True, 1, False),
        "breaker_cooldown": ("EXITLIMIT_BREAKER_COOLDOWN", False, 0, False),
        "ban_cooldown": ("EXITLIMIT_BAN_COOLDOWN", False, 0, False),
        "evict_after": ("EXITLIMIT_EVICT_AFTER", True, 1, False),
        "reanimate_after": ("EXITLIMIT_REANIMATE_AFTER", False, 0, False),
    }.items()
}
_GLUE = {
    "max_retries": ("EXITLIMIT_MAX_RETRIES", True, 0, False, 8),
    "cooldown_min": ("EXITLIMIT_COOLDOWN_MIN", False, 0, False, 0.5),
    "cooldown_default": ("EXITLIMIT_COOLDOWN_DEFAULT", False, 0, False, 2.0),
    "cooldown_max": ("EXITLIMIT_COOLDOWN_MAX", False, 0, True, 600.0),
    "stall_timeout": ("EXITLIMIT_STALL_TIMEOUT", False, 0, True, 120.0),
    # room.py: requests parked per queue while CPU-bound; 0 = the downloader not narrowed
    "busy_room": ("EXITLIMIT_BUSY_ROOM", True, 0, False, BUSY_ROOM),
    # warm start (state_file.py): 0 = written at close only; a day
    "state_save_interval": ("EXITLIMIT_STATE_SAVE_INTERVAL", False, 0, False, 300.0),
    "state_max_age": ("EXITLIMIT_STATE_MAX_AGE", False, 0, True, 86400.0),
}
#: read here, used by the Redis backend (ExitLimitConfig.redis_timeout)
_REDIS_NUMBERS = {
    "redis_timeout": ("EXITLIMIT_REDIS_TIMEOUT", False, 0, True, 1.0),
}
_NUMBERS = {spec[0]: spec
            for table in (_LIMITS, _TUNING, _GLUE, _REDIS_NUMBERS) for spec in table.values()}


def _string(settings: Any, name: str) -> str | None:
    value = settings.get(name)
    if value in (None, ""):
        return None
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string, got {type(value).__name__}")
    return value


def _prefix(settings: Any, name: str) -> str | None:
    value = _string(settings, name)
    if value is not None and ("{" in value or "}" in value):
        raise ValueError(f"{name} ({_short(value)}) must not contain braces: it becomes the "
                         "keys' Redis Cluster hash tag")
    return value


def _on_error(settings: Any, name: str) -> str | None:
    value = settings.get(name)
    if value in (None, ""):
        return None
    if value not in ("local", "pause"):
        raise ValueError(f"{name} ({_short(value)}) must be 'local' or 'pause'")
    return str(value)


def _port(settings: Any, name: str) -> int | None:
    if settings.get(name) in (None, ""):
        return None
    port = _number(settings, name, integer=True, minimum=0)
    if port > 65535:
        raise ValueError(f"{name} ({_short(settings.get(name))}) must be a port number "
                         "(0-65535)")
    return int(port)


def _path(settings: Any, name: str) -> Path | None:
    value = settings.get(name)
    if value in (None, ""):
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise ValueError(f"{name} must be a file path, got {type(value).__name__}")
    if isinstance(value, str) and "\0" in value:
        raise ValueError(f"{name} ({_short(value)}) must be a file path (it holds a NUL)")
    return Path(value).expanduser()


#: everything else: attribute -> (setting, reader (None when unset), default)
_OTHER: dict[str, tuple[str, Callable[[Any, str], Any], Any]] = {
    "redis_url": ("EXITLIMIT_REDIS_URL", _string, None),
    "redis_prefix": ("EXITLIMIT_REDIS_PREFIX", _prefix, "exitlimit"),
    "redis_on_error": ("EXITLIMIT_REDIS_ON_ERROR", _on_error, "local"),
    "telemetry": ("EXITLIMIT_TELEMETRY", _path, None),
    "prometheus_port": ("EXITLIMIT_PROMETHEUS_PORT", _port, None),
    "prometheus_addr": ("EXITLIMIT_PROMETHEUS_ADDR", _string, "127.0.0.1"),
}
_READERS = {name: (reader, default) for name, reader, default in _OTHER.values()}


def read_setting(settings: Any, name: str) -> Any:
    """One setting of the table, parsed (its default when unset); ValueError naming it."""
    if name in _NUMBERS:
        _, integer, minimum, strict, default = _NUMBERS[name]
        value = _number(settings, name, integer=integer, minimum=minimum, strict=strict,
                        optional=True)
    else:
        reader, default = _READERS[name]
        value = reader(settings, name)
    return default if value is None else value


def _read_table(settings: Any, table: dict[str, tuple[Any, ...]]) -> dict[str, Any]:
    return {attr: read_setting(settings, spec[0]) for attr, spec in table.items()}


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
    busy_room: int
    state_save_interval: float
    state_max_age: float
    stats_per_exit: bool
    debug: bool
    lease_timeout: float
    policy: str
    backend: str = "memory"
    #: a response header in which the provider names the exit's IP (None: not used)
    exit_ip_header: str | None = None
    # the _OTHER settings, and EXITLIMIT_REDIS_TIMEOUT (their defaults live in the tables)
    redis_timeout: float = _REDIS_NUMBERS["redis_timeout"][4]
    redis_url: str | None = None
    redis_prefix: str = _OTHER["redis_prefix"][2]
    redis_on_error: str = _OTHER["redis_on_error"][2]
    telemetry: Path | None = None
    prometheus_port: int | None = None
    prometheus_addr: str = _OTHER["prometheus_addr"][2]
    #: EXITLIMIT_SCOPES: configured rates of named scopes (``meta['exitlimit_scope']``)
    scopes: ScopeRules = field(default_factory=ScopeRules)
    stats_per_scope: bool = False
    #: where what was learned is kept between runs (None: nowhere but a shared backend)
    state_file: str | None = None

    @classmethod
    def from_settings(cls, settings: Any) -> ExitLimitConfig:
        if not read_bool(settings, "EXITLIMIT_ENABLED", True):
            raise NotConfigured("EXITLIMIT_ENABLED is False")
        exits = read_exits(settings)
        if not exits:
            raise no_exits_error(settings)
        check_other_settings(settings)
        ids_by_url = {ex.url: ex.id for ex in exits}
        exit_overrides = {
            ids_by_url.get(with_scheme(key), key): spec
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
            **_read_table(settings, _LIMITS),
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
        if backend != "memory" and settings.get("EXITLIMIT_ID_KEY") in (None, "") \
                and any(ex.has_credentials for ex in exits):
            logger.warning("EXITLIMIT_BACKEND is %s but EXITLIMIT_ID_KEY is not set: the ids "
                           "of exits with credentials come from %s, so processes on other "
                           "machines (other keys) will not share those exits' state; give "
                           "every process the same EXITLIMIT_ID_KEY", backend, id_key_path())
        header = settings.get("EXITLIMIT_EXIT_IP_HEADER") or None
        if header is not None and (not isinstance(header, str) or not header.strip()
                                   or any(c in header for c in " :\r\n")):
            raise ValueError(f"EXITLIMIT_EXIT_IP_HEADER ({header!r}) must be a header name")
        state_file = settings.get("EXITLIMIT_STATE_FILE") or None
        config = cls(
            scopes=read_scopes(settings),
            stats_per_scope=read_bool(settings, "EXITLIMIT_STATS_PER_SCOPE", False),
            state_file=None if state_file is None else os.fspath(state_file),
            exit_ip_header=header,
            backend=backend,
            exits=exits,
            limits=limits,
            tuning=tuning,
            stats_per_exit=read_bool(settings, "EXITLIMIT_STATS_PER_EXIT", False),
            debug=read_bool(settings, "EXITLIMIT_DEBUG", False),
            lease_timeout=settings.getfloat("DOWNLOAD_TIMEOUT", 180) + 60,
            policy=policy,
            **glue,
            **_read_table(settings, _REDIS_NUMBERS),
            **_read_table(settings, _OTHER),
        )
        if config.cooldown_min > config.cooldown_max:
            raise ValueError(f"EXITLIMIT_COOLDOWN_MIN ({config.cooldown_min}) must not exceed "
                             f"EXITLIMIT_COOLDOWN_MAX ({config.cooldown_max})")
        return config


def read_scopes(settings: Any) -> ScopeRules:
    """EXITLIMIT_SCOPES: ``{name or pattern: {"rate": r/s, "burst": n}}``; a scope without
    a rate is learned. Names may be secrets: an error shows an entry's position, never
    its name."""
    name = "EXITLIMIT_SCOPES"
    raw = settings.get(name)
    if raw in (None, ""):
        return ScopeRules(key=id_key(settings))
    try:
        table = settings.getdict(name) if hasattr(settings, "getdict") else dict(raw)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a dict of {{scope name or pattern: "
                         "{'rate': r/s, 'burst': n}}") from None
    rules: dict[str, tuple[float | None, int]] = {}
    for position, (key, spec) in enumerate(table.items(), 1):
        label = f"{name} (entry {position})"
        if not isinstance(key, str) or not key:
            raise ValueError(f"{label}: a scope name must be a non-empty string")
        if not isinstance(spec, Mapping):
            raise ValueError(f"{label} must be a dict like {{'rate': 2, 'burst': 1}}, "
                             f"got {type(spec).__name__}")
        unknown = {str(k) for k in spec} - {"rate", "burst"}
        if unknown:
            raise ValueError(f"{label}: unknown keys {sorted(unknown)}; allowed: "
                             "['burst', 'rate']")
        rate = _number({f"{label}['rate']": spec.get("rate")}, f"{label}['rate']",
                       minimum=0, strict=True, optional=True)
        burst = _number({f"{label}['burst']": spec.get("burst")}, f"{label}['burst']",
                        integer=True, minimum=1, optional=True) or 1
        rules[key] = (rate, int(burst))
    return ScopeRules(rules, key=id_key(settings))


def read_bool(settings: Any, name: str, default: bool) -> bool:
    """Scrapy's getbool, with an error that names the setting."""
    try:
        return settings.getbool(name, default)
    except (TypeError, ValueError, OverflowError):  # OverflowError: int(inf), Scrapy < 2.14
        raise ValueError(f"{name} ({_short(settings.get(name))}) must be True or False") \
            from None


#: every setting this package reads (the README's table; the config fuzzer covers them all)
SETTINGS = (
    "EXITLIMIT_ENABLED", "EXITLIMIT_EXITS", "EXITLIMIT_SESSIONS", "EXITLIMIT_ID_KEY",
    "EXITLIMIT_RATE", "EXITLIMIT_BURST", "EXITLIMIT_CONCURRENCY", "EXITLIMIT_ORIGIN_RATE",
    "EXITLIMIT_ORIGIN_BURST", "EXITLIMIT_ORIGIN_SETTINGS", "EXITLIMIT_EXIT_SETTINGS",
    *(name for name, *_ in _TUNING.values()), *(name for name, *_ in _GLUE.values()),
    *(name for name, *_ in _REDIS_NUMBERS.values()), *(name for name, *_ in _OTHER.values()),
    "EXITLIMIT_POLICY", "EXITLIMIT_DEBUG", "EXITLIMIT_STATS_PER_EXIT",
    "EXITLIMIT_EXIT_IP_HEADER", "EXITLIMIT_BACKEND", "EXITLIMIT_SCOPES",
    "EXITLIMIT_STATS_PER_SCOPE", "EXITLIMIT_STATE_FILE",
)

#: short names EXITLIMIT_BACKEND takes besides a class path (backends.ALIASES)
BACKEND_NAMES = ("memory", "redis")
_CLASS_PATH = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+")


def check_other_settings(settings: Any) -> None:
    """The classes to load (EXITLIMIT_BACKEND, EXITLIMIT_POLICY), checked at start with
    errors that name them, before anything is imported."""
    backend = settings.get("EXITLIMIT_BACKEND")
    if isinstance(backend, str) and backend and backend not in BACKEND_NAMES \
            and not _CLASS_PATH.fullmatch(backend):
        hint = (f" (did you mean {backend.strip().lower()!r}?)"
                if backend.strip().lower() in BACKEND_NAMES else "")
        raise ValueError(f"EXITLIMIT_BACKEND ({_short(backend)}) must be 'memory', 'redis' or "
                         f"the path of a Backend class (mypackage.backends.MyBackend){hint}")
    if backend not in (None, "") and not isinstance(backend, (str, type)):
        raise ValueError(f"EXITLIMIT_BACKEND ({_short(backend)}) must be 'memory', 'redis' or "
                         "a Backend class or its path")
    policy = settings.get("EXITLIMIT_POLICY")
    if policy not in (None, "") and not isinstance(policy, (str, type)):
        raise ValueError(f"EXITLIMIT_POLICY ({_short(policy)}) must be a ResponsePolicy "
                         "subclass or its path")
    state_file = settings.get("EXITLIMIT_STATE_FILE")
    if state_file not in (None, "") and not isinstance(state_file, (str, os.PathLike)):
        raise ValueError(f"EXITLIMIT_STATE_FILE must be a file path, got "
                         f"{type(state_file).__name__}")
    if isinstance(state_file, str) and "\0" in state_file:
        raise ValueError(f"EXITLIMIT_STATE_FILE ({_short(state_file)}) must be a file path "
                         "(it holds a NUL)")
