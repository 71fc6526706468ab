"""Retry-After (RFC 9110 section 10.2.3) and HTTP-date parsing, locale independent."""

from __future__ import annotations

import calendar
import math
import re
from email.utils import parsedate_tz

_DELTA = re.compile(r"^\+?(\d+(?:\.\d+)?)$")


def _text(value: str | bytes | None) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    return value.strip().lower()


def parse_http_date(value: str | bytes | None) -> float | None:
    """An HTTP-date in any of its three RFC 9110 forms (IMF-fixdate, RFC 850, asctime) as
    a Unix timestamp, else None.

    The standard library's ``email.utils`` reads all three (a two-digit year is taken as
    19xx from 69 on, else 20xx); a field out of range (the 32nd, hour 25) is refused here
    rather than rolled over into the next day.
    """
    text = _text(value)
    if not text:
        return None
    try:
        parts = parsedate_tz(text)
        if parts is None:
            return None
        year, month, day, hh, mm, ss = parts[:6]
        if not (1 <= day <= calendar.monthrange(year, month)[1] and 0 <= hh <= 23
                and 0 <= mm <= 59 and 0 <= ss <= 60):
            return None
        stamp = calendar.timegm((year, month, day, hh, mm, min(ss, 59), 0, 0, 0))
        return float(stamp - (parts[9] or 0))
    except Exception:  # email.utils is lenient, but not promised never to raise
        return None


def parse_retry_after(
    value: str | bytes | None, *, date: str | bytes | None = None, now: float
) -> float | None:
    """Seconds to wait from a Retry-After value, or None when absent or unreadable.

    The HTTP-date form is measured against the response's own ``Date`` header
    when it has a readable one, so a skewed local clock does not stretch or
    shrink the wait; ``now`` (Unix time) is the fallback. The result is finite; it
    may be 0 or negative: bounding it is the caller's policy (:func:`bounded_cooldown`).
    """
    text = _text(value)
    if not text:
        return None
    if m := _DELTA.match(text):
        seconds = float(m.group(1))
        # hundreds of digits overflow to inf: no wait a clock can reach, so unreadable
        return seconds if math.isfinite(seconds) else None
    when = parse_http_date(text)
    if when is None:
        return None
    reference = parse_http_date(date)
    return when - (reference if reference is not None else now)


def bounded_cooldown(
    seconds: float | None, *, floor: float, cap: float, default: float
) -> float:
    """Missing or unreadable (None, NaN) → ``default``; then clamped to ``[floor, cap]``."""
    if seconds is None or math.isnan(seconds):
        seconds = default
    return min(max(seconds, floor), cap)
