import calendar

import pytest

from scrapy_exitlimit.core import bounded_cooldown, parse_http_date, parse_retry_after

NOW = float(calendar.timegm((2026, 11, 29, 9, 0, 0, 0, 0, 0)))


@pytest.mark.parametrize(
    ("value", "date", "expected"),
    [
        # delta-seconds
        ("120", None, 120.0),
        (b"1", None, 1.0),
        ("0", None, 0.0),
        (" 7 ", None, 7.0),
        ("1.5", None, 1.5),  # not RFC, but sent in the wild (e.g. some gateways)
        ("+3", None, 3.0),
        ("99999999", None, 99999999.0),
        # IMF-fixdate, measured against the response Date header
        ("Sun, 29 Nov 2026 09:00:30 GMT", "Sun, 29 Nov 2026 09:00:00 GMT", 30.0),
        ("Sun, 29 Nov 2026 09:00:30 GMT", None, 30.0),  # falls back to local clock
        # server clock is 1h behind ours: its own Date keeps the wait at 5 s
        ("Sun, 29 Nov 2026 08:00:05 GMT", "Sun, 29 Nov 2026 08:00:00 GMT", 5.0),
        ("sun, 29 nov 2026 09:01:00 gmt", None, 60.0),
        ("Sun, 29 Nov 2026 09:00:10 UTC", None, 10.0),
        # obsolete forms RFC 9110 still asks recipients to accept
        ("Sunday, 29-Nov-26 09:00:20 GMT", None, 20.0),
        ("Sun Nov 29 09:00:40 2026", None, 40.0),
        ("Sun Nov  1 09:00:00 2026", None, -28 * 86400.0),
        # a date in the past: the caller's floor handles it
        ("Sun, 29 Nov 2026 08:59:00 GMT", None, -60.0),
        # unreadable Date header: local clock
        ("Sun, 29 Nov 2026 09:00:30 GMT", "yesterday", 30.0),
    ],
)
def test_retry_after_values(value, date, expected):
    assert parse_retry_after(value, date=date, now=NOW) == pytest.approx(expected)


@pytest.mark.parametrize(
    "value",
    [None, "", "   ", "soon", "-1", "1e3", "12 seconds", "NaN", "inf", "0x10",
     "Sun, 32 Nov 2026 09:00:00 GMT", "Sun, 29 Foo 2026 09:00:00 GMT",
     "Sun, 29 Nov 2026 25:00:00 GMT", b"\xff\xfe", "Sun, 29 Nov 2026",
     "9" * 400],  # overflows a float: inf is no wait
)
def test_garbage_is_none(value):
    assert parse_retry_after(value, now=NOW) is None


def test_http_date_forms_agree():
    forms = ["Sun, 06 Nov 1994 08:49:37 GMT", "Sunday, 06-Nov-94 08:49:37 GMT",
             "Sun Nov  6 08:49:37 1994"]
    assert {parse_http_date(f) for f in forms} == {784111777.0}


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [(None, 2.0), (float("nan"), 2.0), (0.0, 0.5), (-60.0, 0.5), (0.2, 0.5), (3.0, 3.0),
     (1e9, 600.0), (float("inf"), 600.0)],
)
def test_bounded_cooldown(seconds, expected):
    assert bounded_cooldown(seconds, floor=0.5, cap=600.0, default=2.0) == expected
