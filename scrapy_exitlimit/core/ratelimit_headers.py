"""Rate-limit quota headers (IETF RateLimit drafts, X-RateLimit-*) read into one ``Quota``.

A server that states its quota lets us pace under it instead of learning it from 429s.
Everything here is lenient on purpose: a malformed field is ignored, never raised on,
because a server's bad header must not take down the crawl.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from .retry_after import parse_http_date

__all__ = ["RATELIMIT_HEADERS", "Quota", "QuotaWindows", "parse_ratelimit"]

# Every header name this module reads, in its usual spelling.
RATELIMIT_HEADERS: tuple[str, ...] = (
    "RateLimit",
    "RateLimit-Policy",
    "RateLimit-Limit",
    "RateLimit-Remaining",
    "RateLimit-Reset",
    "X-RateLimit-Limit",
    "X-RateLimit-Remaining",
    "X-RateLimit-Reset",
    "X-RateLimit-Reset-After",
    "X-RateLimit-Window",
    "X-RateLimit-Period",
    "X-Rate-Limit-Limit",
    "X-Rate-Limit-Remaining",
    "X-Rate-Limit-Reset",
    "X-Rate-Limit-Reset-After",
    "X-Rate-Limit-Window",
    "X-Rate-Limit-Period",
)
_WANTED = frozenset(name.lower() for name in RATELIMIT_HEADERS)

# A reset above this is an epoch timestamp, not a delta: no window lasts 30+ years.
_EPOCH_THRESHOLD = 1e9

# Plain decimals only: float() alone would also take "1_0", "1e3", "nan", "-0".
_NUMBER = re.compile(r"\d+(?:\.\d*)?|\.\d+")
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)")
_UNIT_SECONDS = {
    **dict.fromkeys(("", "s", "sec", "secs", "second", "seconds"), 1.0),
    "ms": 0.001,
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60.0),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3600.0),
    **dict.fromkeys(("d", "day", "days"), 86400.0),
}
# Structured-field token (RFC 8941 sf-token), for unquoted policy names.
_TOKEN = re.compile(r"[a-z*][a-z0-9_\-.:%*/!#$&'+^`|~]*", re.IGNORECASE)


@dataclass(frozen=True)
class Quota:
    """What a response says about its rate limit; any field may be unknown (None).

    ``limit`` requests per ``window`` seconds is the policy; ``remaining`` requests are
    left in the current window, which resets (or refills) in ``reset`` seconds.
    """

    limit: float | None = None
    window: float | None = None
    remaining: float | None = None
    reset: float | None = None

    @property
    def rate(self) -> float | None:
        """The policy rate in requests/s: ``limit / window`` when both are known and > 0."""
        if self.limit is None or self.window is None:
            return None
        if not (self.limit > 0 and self.window > 0):
            return None
        return _finite(self.limit / self.window)


class QuotaWindows:
    """The window of ``N per window ending at Reset`` quotas that do not state it.

    ``X-RateLimit-Limit`` with ``-Remaining`` and ``-Reset`` (seconds or an epoch,
    both seen in the wild; ``parse_ratelimit`` makes either a delta) says how many
    requests a window allows and when it ends, not how long it is. The length shows
    when a window opens: the answer to the request that opened it (``remaining`` is
    ``limit - 1``, or it jumped back up while ``reset`` moved more than a second
    later) states a reset one full window away. Resets come in whole seconds, rounded
    up: a delta, or the window's end as an epoch second. So the window, a whole
    number of seconds, is at most the reset plus the time the answer took to come
    back (``latency``), and more than that less one second: the largest whole number
    of seconds in that range is safe (``ceil`` of the reset alone read a 1 s window
    stated as an epoch as 2 s, pacing at half the limit). The shortest reading so far
    is the window; from then on the rate is ``limit / window``. A window that is not a
    whole number of seconds may read short: the 429 that follows makes the limiter
    stop trusting the statement. One per key (a pair, or a scope); plain arithmetic,
    no clock of its own.
    """

    __slots__ = ("_last", "windows")

    def __init__(self) -> None:
        # key -> (remaining, reset) at the previous answer
        self._last: dict[Any, tuple[float, float]] = {}
        self.windows: dict[Any, float] = {}

    def rate(self, key: Any, quota: Quota, latency: float = 0.0) -> float | None:
        """The rate ``quota`` states, or the one its windows have shown, or None.
        ``latency``: seconds from sending the request to reading this answer."""
        if quota.rate is not None:
            return quota.rate
        if quota.limit is None or quota.remaining is None or quota.reset is None:
            return None
        previous = self._last.get(key)
        self._last[key] = (quota.remaining, quota.reset)
        opened = quota.remaining >= quota.limit - 1 or (
            previous is not None and quota.remaining > previous[0]
            and quota.reset > previous[1] + 1.0)
        if opened and quota.reset > 0:
            reading = quota.reset + max(latency, 0.0)
            window = float(math.floor(reading + 1e-9)) or reading
            if window < self.windows.get(key, math.inf):
                self.windows[key] = window
        window = self.windows.get(key)
        if window is None or not quota.limit > 0:
            return None
        return _finite(quota.limit / window)


def parse_ratelimit(headers: Any, *, now: float) -> Quota | None:
    """Read every common rate-limit header form from ``headers`` into one :class:`Quota`.

    ``headers`` is anything with ``.items()`` or ``.get()`` (a dict with str or bytes
    keys, Scrapy ``Headers``); names match case-insensitively. ``now`` is Unix time,
    used only for resets given as epoch timestamps. Where several forms are present
    the IETF fields win over X-RateLimit-*, field by field. None when no rate-limit
    header is present or none of them is readable.
    """
    fields = _collect(headers)
    if not fields:
        return None

    # limit/window: the most restrictive announced policy, else a bare limit (no window
    # is guessed from a reset: a reset says when, not how long the window is).
    policies = _parse_policies(_joined(fields, "ratelimit-policy"))
    limit_fields: dict[str, float | None] = {}
    for prefix in ("ratelimit", "x-ratelimit", "x-rate-limit"):
        first, embedded = _parse_limit_field(_joined(fields, f"{prefix}-limit"))
        limit_fields[prefix] = first
        policies.extend(embedded)
    policy = _most_restrictive(policies)

    current = _parse_current(_joined(fields, "ratelimit"), policy.name if policy else None)

    limit: float | None = None
    window: float | None = None
    if policy is not None:
        limit, window = policy.quota, policy.window
    elif current.limit is not None:
        limit = current.limit
    elif limit_fields["ratelimit"] is not None:
        limit = limit_fields["ratelimit"]
    else:
        for prefix in ("x-ratelimit", "x-rate-limit"):
            if limit_fields[prefix] is not None:
                limit = limit_fields[prefix]
                window = _first_of(
                    _duration(_first(fields, f"{prefix}-window")),
                    _duration(_first(fields, f"{prefix}-period")),
                )
                break

    remaining = _first_of(
        current.remaining,
        _scalar(_first(fields, "ratelimit-remaining")),
        _scalar(_first(fields, "x-ratelimit-remaining")),
        _scalar(_first(fields, "x-rate-limit-remaining")),
    )
    reset = _first_of(
        current.reset,
        _reset(_first(fields, "ratelimit-reset"), now),
        # Reset-After is a plain delta with sub-second precision: preferred over Reset.
        _scalar(_first(fields, "x-ratelimit-reset-after")),
        _reset(_first(fields, "x-ratelimit-reset"), now),
        _scalar(_first(fields, "x-rate-limit-reset-after")),
        _reset(_first(fields, "x-rate-limit-reset"), now),
    )
    if limit is None and window is None and remaining is None and reset is None:
        return None
    return Quota(limit=limit, window=window, remaining=remaining, reset=reset)


# --- header access -----------------------------------------------------------------------


def _collect(headers: Any) -> dict[str, list[str]]:
    """Lowercase name -> its values as text, for the names we read; {} when unreadable."""
    found: dict[str, list[str]] = {}
    items = getattr(headers, "items", None)
    if callable(items):
        try:
            for key, value in items():
                name = _wanted_name(key)
                if name is not None:
                    found.setdefault(name, []).extend(_values(value))
            return found
        except Exception:  # an exotic mapping; fall back to get()
            found.clear()
    get = getattr(headers, "get", None)
    if not callable(get):
        return found
    for name in RATELIMIT_HEADERS:
        for key in (name, name.lower(), name.encode(), name.lower().encode()):
            try:
                values = _values(get(key))
            except Exception:
                continue
            if values:
                found[name.lower()] = values
                break
    return found


def _wanted_name(key: object) -> str | None:
    """The name a header is read as (None: not one of ours)."""
    try:
        return _wanted_name_memo(key)
    except TypeError:  # an unhashable name
        return _read_name(key)


def _read_name(key: object) -> str | None:
    text = _text(key)
    name = text.strip().lower() if text is not None else None
    return name if name in _WANTED else None


#: every answer carries the same few names, and each answer's are read
_wanted_name_memo = lru_cache(maxsize=1024)(_read_name)


def _text(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("latin-1")  # never fails; non-ASCII then just won't parse
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return None


def _values(value: object) -> list[str]:
    """One header value, or a list of them (Scrapy ``Headers`` gives list[bytes]), as text."""
    raw: Iterable[object] = value if isinstance(value, (list, tuple)) else (value,)
    return [text for text in map(_text, raw) if text is not None]


def _first(fields: dict[str, list[str]], name: str) -> str | None:
    """A scalar field: its first line (repeats of a scalar header add nothing)."""
    values = fields.get(name)
    return values[0] if values else None


def _joined(fields: dict[str, list[str]], name: str) -> str | None:
    """A list-valued field: repeated lines combine with commas (RFC 9110 section 5.3)."""
    values = fields.get(name)
    return ", ".join(values) if values else None


# --- numbers -------------------------------------------------------------------------------


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) and value >= 0 else None


def _num(text: str | None) -> float | None:
    """A non-negative finite decimal, else None."""
    if text is None:
        return None
    text = text.strip()
    if not _NUMBER.fullmatch(text):
        return None
    return _finite(float(text))


def _scalar(text: str | None) -> float | None:
    """A number from an Item-ish field, ignoring any parameters or further list members."""
    if text is None:
        return None
    return _num(_unquote(_split(_split(text, ",")[0], ";")[0]))


def _duration(text: str | None) -> float | None:
    """Seconds from "60", "60s", "1m", "1h", "1d", "500ms"; else None."""
    if text is None:
        return None
    match = _DURATION.fullmatch(text.strip().lower())
    if match is None or match.group(2) not in _UNIT_SECONDS:
        return None
    return _finite(float(match.group(1)) * _UNIT_SECONDS[match.group(2)])


def _reset(text: str | None, now: float) -> float | None:
    """Seconds until reset from a delta, an epoch timestamp or an HTTP-date; clamped >= 0."""
    if text is None:
        return None
    value = _scalar(text)
    if value is not None and value <= _EPOCH_THRESHOLD:
        return value
    when = value if value is not None else parse_http_date(text)
    if when is None:
        return None
    try:
        delta = float(when) - float(now)
    except (TypeError, ValueError, OverflowError):
        return None
    return None if math.isnan(delta) else _finite(max(delta, 0.0))


def _first_of(*values: float | None) -> float | None:
    return next((value for value in values if value is not None), None)


# --- structured-field-ish parsing ------------------------------------------------------------


def _split(text: str, sep: str) -> list[str]:
    """Split on ``sep`` outside double quotes (backslash escapes honoured), stripped."""
    parts: list[str] = []
    buf: list[str] = []
    quoted = escaped = False
    for ch in text:
        if escaped:
            escaped = False
        elif quoted and ch == "\\":
            escaped = True
        elif ch == '"':
            quoted = not quoted
        elif ch == sep and not quoted:
            parts.append("".join(buf).strip())
            buf = []
            continue
        buf.append(ch)
    parts.append("".join(buf).strip())
    return parts


def _unquote(text: str) -> str | None:
    """A quoted sf-string's content; unquoted text as is; None when the quote is unbalanced."""
    text = text.strip()
    if not text.startswith('"'):
        return text
    out: list[str] = []
    escaped = False
    for i, ch in enumerate(text[1:], 1):
        if escaped:
            out.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            return "".join(out) if i == len(text) - 1 else None
        else:
            out.append(ch)
    return None


def _member(text: str) -> tuple[str, dict[str, str | None]]:
    """A list member as (bare item text, lowercase params); a bare param key is ``"?1"``."""
    head, *rest = _split(text, ";")
    params: dict[str, str | None] = {}
    for param in rest:
        key, eq, value = param.partition("=")
        key = key.strip().lower()
        if key:
            params[key] = _unquote(value) if eq else "?1"
    return head, params


def _name(head: str) -> str | None:
    """A policy name (sf-string or token), lowercased so matching ignores case."""
    if head.startswith('"'):
        name = _unquote(head)
        return None if name is None else name.lower()
    return head.lower() if _TOKEN.fullmatch(head) else None


@dataclass(frozen=True)
class _Policy:
    name: str | None
    quota: float | None
    window: float | None


def _policy(member: str) -> _Policy | None:
    """One policy: draft 06/07 ``10;w=60`` or draft 08+ ``"name";q=10;w=60``."""
    head, params = _member(member)
    if "qu" in params and (params["qu"] or "").strip().lower() != "requests":
        return None  # bytes or concurrency quotas do not pace requests
    window = _num(params.get("w"))
    quota = _num(head)
    name = None
    if quota is None:
        name = _name(head)
        if name is None:
            return None
        # "l" is how an interim editor's draft spelled the quota.
        quota = _first_of(_num(params.get("q")), _num(params.get("l")))
    if quota is None:
        return None
    return _Policy(name, quota, window)


def _parse_policies(text: str | None) -> list[_Policy]:
    if text is None:
        return []
    policies = (_policy(member) for member in _split(text, ",") if member)
    return [policy for policy in policies if policy is not None]


def _parse_limit_field(text: str | None) -> tuple[float | None, list[_Policy]]:
    """Draft 00-06 ``RateLimit-Limit: 10, 10;w=1, 1000;w=3600``: current limit, policies."""
    if text is None:
        return None, []
    members = [member for member in _split(text, ",") if member]
    if not members:
        return None, []
    first = _num(_unquote(_split(members[0], ";")[0]))
    policies = [
        policy
        for policy in map(_policy, members)
        if policy is not None and policy.name is None and policy.window is not None
    ]
    return first, policies


def _most_restrictive(policies: list[_Policy]) -> _Policy | None:
    """Lowest quota/window wins; without any window, the first policy (ties: first)."""
    rated = [p for p in policies if p.quota is not None and p.window is not None and p.window > 0]
    if rated:
        return min(rated, key=lambda p: (p.quota or 0.0) / (p.window or 1.0))
    return policies[0] if policies else None


@dataclass(frozen=True)
class _Current:
    limit: float | None = None
    remaining: float | None = None
    reset: float | None = None


def _parse_current(text: str | None, policy_name: str | None) -> _Current:
    """The ``RateLimit`` field: draft 07 ``limit=10, remaining=5, reset=30`` or draft 08+
    ``"name";r=5;t=30`` items, the one naming the chosen policy preferred."""
    if text is None:
        return _Current()
    keyed: dict[str, float | None] = {}
    items: list[tuple[str | None, _Current]] = []
    for member in _split(text, ","):
        if not member:
            continue
        head, params = _member(member)
        key, eq, value = head.partition("=")
        if eq and not head.startswith('"'):  # draft 07 dictionary member
            keyed.setdefault(key.strip().lower(), _num(_unquote(value)))
            continue
        current = _Current(remaining=_num(params.get("r")), reset=_num(params.get("t")))
        if current.remaining is not None or current.reset is not None:
            items.append((_name(head), current))
    if items:
        # An exhausted quota (r=0) blocks whatever the other policies say: it wins,
        # the longest wait first. Otherwise the item for the chosen policy, else the first.
        exhausted = [current for _, current in items if current.remaining == 0]
        if exhausted:
            return max(exhausted, key=lambda c: c.reset or 0.0)
        named = [current for name, current in items if policy_name and name == policy_name]
        return named[0] if named else items[0][1]
    return _Current(keyed.get("limit"), keyed.get("remaining"), keyed.get("reset"))
