"""Retry-After (RFC 9110 section 10.2.3) and HTTP-date parsing, locale independent."""

from __future__ import annotations

import calendar
import math
import re

_MONTHS = {
    m: i
    for i, m in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), 1
    )
}
_TIME = r"(\d{1,2}):(\d{2}):(\d{2})"
# IMF-fixdate: Sun, 06 Nov 1994 08:49:37 GMT
_IMF = re.compile(
    r"^[a-z]{3},\s*(\d{1,2})\s+([a-z]{3})\s+(\d{4})\s+" + _TIME + r"\s*(gmt|utc|ut|z)?$"
)
# obsolete RFC 850: Sunday, 06-Nov-94 08:49:37 GMT
_RFC850 = re.compile(r"^[a-z]+,\s*(\d{1,2})-([a-z]{3})-(\d{2,4})\s+" + _TIME + r"\s*(gmt|utc)?$")
# obsolete asctime: Sun Nov  6 08:49:37 1994
_ASCTIME = re.compile(r"^[a-z]{3}\s+([a-z]{3})\s+(\d{1,2})\s+" + _TIME + r"\s+(\d{4})$")
_DELTA = re.compile(r"^\+?(\d+(?:\.\d+)?)$")


def _text(value: str | bytes | None) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    return value.strip().lower()


def _timestamp(year: int, month: str, day: int, hh: int, mm: int, ss: int) -> float | None:
    mon = _MONTHS.get(month)
    if mon is None or not (1 <= day <= 31 and hh <= 23 and mm <= 59 and ss <= 60):
        return None
    try:
        return float(calendar.timegm((year, mon, day, hh, mm, min(ss, 59), 0, 0, 0)))
    except (ValueError, OverflowError):
        return None


def parse_http_date(value: str | bytes | None) -> float | None:
    """An HTTP-date in any of its three RFC 9110 forms as a Unix timestamp, else None."""
    text = _text(value)
    if m := _IMF.match(text):
        day, mon, year, hh, mm, ss = m.groups()[:6]
        return _timestamp(int(year), mon, int(day), int(hh), int(mm), int(ss))
    if m := _RFC850.match(text):
        day, mon, year, hh, mm, ss = m.groups()[:6]
        y = int(year)
        if y < 100:  # RFC 9110: a two-digit year more than 50 years ahead is in the past
            y += 2000 if y < 70 else 1900
        return _timestamp(y, mon, int(day), int(hh), int(mm), int(ss))
    if m := _ASCTIME.match(text):
        mon, day, hh, mm, ss, year = m.groups()
        return _timestamp(int(year), mon, int(day), int(hh), int(mm), int(ss))
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
