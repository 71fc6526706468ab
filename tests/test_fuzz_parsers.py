"""Fuzzing what comes from outside: response headers and settings.

A server's header or a user's setting may be anything. The parsers must never raise on a
header, must only return finite non-negative numbers (or None), and a bad setting must be
refused with a ValueError that names it (or NotConfigured), never with a stray TypeError.
"""

from __future__ import annotations

import calendar
import math
import re
import string
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from scrapy.exceptions import NotConfigured
from scrapy.http.headers import Headers
from scrapy.settings import Settings

from scrapy_exitlimit import config as config_module
from scrapy_exitlimit.config import ExitLimitConfig
from scrapy_exitlimit.core import (
    bounded_cooldown,
    make_exit,
    parse_http_date,
    parse_retry_after,
)
from scrapy_exitlimit.core.ratelimit_headers import (
    RATELIMIT_HEADERS,
    Quota,
    parse_ratelimit,
)

# no example database: nothing is written into the work tree
SETTINGS = settings(max_examples=200, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
NOW = float(calendar.timegm((2026, 11, 29, 9, 0, 0, 0, 0, 0)))

# -- building blocks -------------------------------------------------------------------------

DAYS = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
LONG_DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]

#: every shape a number takes on the wire, sane or not
number_texts = st.one_of(
    st.integers(min_value=-10**6, max_value=10**12).map(str),
    st.integers(min_value=10**300, max_value=10**400).map(str),  # overflows a float
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.floats(min_value=0, max_value=1e6).map(lambda f: f"{f:.3f}"),
    st.sampled_from(["nan", "NaN", "inf", "-inf", "Infinity", "1e3", "1_0", "0x10", "-0",
                     "+5", "+", ".5", "5.", "1.2.3", "٣", "²", " 7 ", "\t8\r\n", "9" * 400]),
)


@st.composite
def http_dates(draw) -> str:
    """IMF-fixdate, RFC 850 and asctime forms, with fields in and out of range."""
    sane = draw(st.booleans())
    day = draw(st.integers(1, 28) if sane else st.integers(0, 99))
    hour = draw(st.integers(0, 23) if sane else st.integers(0, 99))
    minute = draw(st.integers(0, 59) if sane else st.integers(0, 99))
    second = draw(st.integers(0, 60) if sane else st.integers(0, 99))
    year = draw(st.integers(1970, 2100) if sane else st.integers(0, 9999))
    month = draw(st.sampled_from(MONTHS) if sane else
                 st.one_of(st.sampled_from(MONTHS), st.text(string.ascii_letters, max_size=4)))
    zone = draw(st.sampled_from(["GMT", "UTC", "UT", "Z", "", "PST", "+0000"]))
    form = draw(st.sampled_from(["imf", "rfc850", "asctime"]))
    if form == "imf":
        text = (f"{draw(st.sampled_from(DAYS))}, {day:02d} {month} {year:04d} "
                f"{hour:02d}:{minute:02d}:{second:02d} {zone}")
    elif form == "rfc850":
        text = (f"{draw(st.sampled_from(LONG_DAYS))}, {day:02d}-{month}-{year % 100:02d} "
                f"{hour:02d}:{minute:02d}:{second:02d} {zone}")
    else:
        text = (f"{draw(st.sampled_from(DAYS))} {month} {day:2d} "
                f"{hour:02d}:{minute:02d}:{second:02d} {year}")
    if not sane and draw(st.booleans()):  # chop or splice the text somewhere
        cut = draw(st.integers(0, len(text)))
        text = text[:cut] + draw(st.text(max_size=3)) + text[cut + 1:]
    return text


def to_wire(texts: st.SearchStrategy[str]) -> st.SearchStrategy[str | bytes]:
    return st.one_of(texts, texts.map(lambda t: t.encode("utf-8")))


header_values = to_wire(st.one_of(st.text(max_size=40), number_texts, http_dates()))
retry_after_values = st.one_of(st.none(), st.binary(max_size=40), header_values)
nows = st.one_of(st.just(NOW), st.floats(min_value=0.0, max_value=4e9))


def is_delta(value: str | bytes | None) -> bool:
    if value is None:
        return False
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    return text.strip().lstrip("+").replace(".", "", 1).isdigit()


# -- Retry-After -------------------------------------------------------------------------------


@SETTINGS
@given(retry_after_values, st.one_of(st.none(), header_values, st.binary(max_size=30)), nows)
@example("9" * 400, None, NOW)  # was inf: hundreds of digits overflow a float
@example("Fri, 31 Dec 9999 23:59:59 GMT", "Mon, 01 Jan 0001 00:00:00 GMT", NOW)
@example("Sun, 29 Feb 2026 09:00:00 GMT", b"\xff\xfe", NOW)
def test_parse_retry_after_never_raises_and_is_finite(value, date, now):
    seconds = parse_retry_after(value, date=date, now=now)
    assert seconds is None or (isinstance(seconds, float) and math.isfinite(seconds))
    if seconds is not None and is_delta(value):
        assert seconds >= 0  # delta-seconds: only an HTTP-date may lie in the past


@SETTINGS
@given(header_values)
def test_parse_http_date_never_raises_and_is_finite(value):
    when = parse_http_date(value)
    assert when is None or math.isfinite(when)


@SETTINGS
@given(
    st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
    st.floats(min_value=0.0, max_value=1e4),
    st.floats(min_value=0.0, max_value=1e5),
    st.floats(min_value=0.0, max_value=1e4),
)
def test_bounded_cooldown_is_within_floor_and_cap(seconds, floor, span, default):
    cap = floor + span
    wait = bounded_cooldown(seconds, floor=floor, cap=cap, default=default)
    assert math.isfinite(wait) and floor <= wait <= cap


@SETTINGS
@given(retry_after_values, st.one_of(st.none(), header_values), nows)
def test_retry_after_through_bounded_cooldown_is_a_usable_wait(value, date, now):
    wait = bounded_cooldown(parse_retry_after(value, date=date, now=now),
                            floor=0.5, cap=600.0, default=2.0)
    assert math.isfinite(wait) and 0.5 <= wait <= 600.0


# -- rate-limit quota headers ------------------------------------------------------------------

header_names = st.one_of(
    st.sampled_from(RATELIMIT_HEADERS).flatmap(
        lambda name: st.sampled_from([name, name.lower(), name.upper(), f" {name} "])),
    st.text(max_size=15),
)
numbers_in_fields = st.one_of(number_texts, st.integers(0, 10**10).map(str))
structured_values = st.one_of(
    # draft 06/07 policies and limits: "10, 10;w=1, 1000;w=3600"
    st.lists(st.tuples(numbers_in_fields, st.one_of(st.none(), numbers_in_fields)), max_size=4)
    .map(lambda ms: ", ".join(q if w is None else f"{q};w={w}" for q, w in ms)),
    # draft 07 dictionary: "limit=10, remaining=5, reset=30"
    st.lists(st.tuples(st.sampled_from(["limit", "remaining", "reset", "x"]), numbers_in_fields),
             max_size=4).map(lambda kv: ", ".join(f"{k}={v}" for k, v in kv)),
    # draft 08+ items: '"name";q=10;w=60' / '"name";r=5;t=30', names quoted or not
    st.lists(st.tuples(st.sampled_from(['"default"', "default", '"a\\"b"', '"open', "1x", ""]),
                       st.lists(st.tuples(st.sampled_from(["q", "w", "r", "t", "l", "qu", "pk"]),
                                          st.one_of(numbers_in_fields,
                                                    st.sampled_from(['"requests"', '"bytes"',
                                                                     "requests", '"', ""]))),
                                max_size=4)),
             max_size=3)
    .map(lambda items: ", ".join(
        head + "".join(f";{k}={v}" for k, v in params) for head, params in items)),
    # durations for X-RateLimit-Window / Period
    st.tuples(numbers_in_fields, st.sampled_from(["", "s", "ms", "m", "h", "d", "weeks", " s"]))
    .map("".join),
    http_dates(),
    st.text(max_size=40),
)
raw_values: st.SearchStrategy[Any] = st.one_of(
    to_wire(structured_values),
    st.lists(to_wire(structured_values), max_size=3),
    st.tuples(to_wire(structured_values)),
    st.integers(min_value=-10**20, max_value=10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.none(),
    st.booleans(),
    st.just({"nested": "dict"}),
    st.just([None, 3, b"5"]),
)
header_keys = st.one_of(header_names, header_names.map(lambda n: n.encode("utf-8")),
                        st.integers(), st.none())
header_dicts = st.dictionaries(header_keys, raw_values, max_size=6)


def check_quota(quota: Quota | None) -> None:
    if quota is None:
        return
    assert isinstance(quota, Quota)
    for name in ("limit", "window", "remaining", "reset"):
        value = getattr(quota, name)
        assert value is None or (math.isfinite(value) and value >= 0), (name, value)
    assert quota.rate is None or (math.isfinite(quota.rate) and quota.rate >= 0), quota.rate


@SETTINGS
@given(header_dicts, nows)
@example({"RateLimit-Policy": "1;w=" + "0" * 400 + "1"}, NOW)  # a denormal window
@example({"X-RateLimit-Limit": "9" * 400, "X-RateLimit-Window": "9" * 300 + "d"}, NOW)
@example({"X-RateLimit-Reset": "Fri, 31 Dec 9999 23:59:59 +9999"}, NOW)
@example({b"ratelimit": [b'"a";r=0;t=' + b"9" * 400, b'"b";r=0;t=5']}, NOW)
def test_parse_ratelimit_never_raises_and_is_finite(headers, now):
    check_quota(parse_ratelimit(headers, now=now))


@SETTINGS
@given(st.dictionaries(st.sampled_from(RATELIMIT_HEADERS),
                       st.one_of(to_wire(structured_values),
                                 st.lists(to_wire(structured_values), min_size=1, max_size=3)),
                       max_size=6),
       nows)
def test_parse_ratelimit_on_scrapy_headers(values, now):
    check_quota(parse_ratelimit(Headers(values), now=now))


class OnlyGet:
    """A header container with ``get()`` only, whose lookups may blow up."""

    def __init__(self, values: dict[Any, Any], explode: bool) -> None:
        self.values, self.explode = values, explode

    def get(self, key: Any) -> Any:
        if self.explode and isinstance(key, bytes):
            raise KeyError(key)
        return self.values.get(key)


class BrokenItems(dict):
    def items(self):  # type: ignore[override]
        raise RuntimeError("exotic mapping")


@SETTINGS
@given(header_dicts, st.booleans(), nows)
def test_parse_ratelimit_on_odd_containers(headers, explode, now):
    check_quota(parse_ratelimit(OnlyGet(headers, explode), now=now))
    check_quota(parse_ratelimit(BrokenItems(headers), now=now))
    check_quota(parse_ratelimit(list(headers.items()), now=now))  # no .items(), no .get()
    assert parse_ratelimit(None, now=now) is None


# -- settings ----------------------------------------------------------------------------------

EXIT_URLS = ["http://127.0.0.1:9000", "http://u:secret@127.0.0.1:9001"]
#: every number the settings table reads (config._NUMBERS: limits, tuning, glue, Redis)
NUMERIC_SETTINGS = sorted(config_module._NUMBERS)
INTEGER_SETTINGS = {name for name, (_, integer, *_) in config_module._NUMBERS.items() if integer}


#: what a settings value may be: from a settings.py, a -s flag (a string) or an env var
setting_values = st.one_of(
    st.none(),
    st.just(""),
    st.booleans(),
    st.integers(min_value=-10**6, max_value=10**6),
    st.integers(min_value=-10**30, max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=-10.0, max_value=1e4),
    number_texts,
    st.text(max_size=20),
    st.binary(max_size=8),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def exit_overrides(keys: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    spec = st.one_of(
        st.dictionaries(st.sampled_from(["rate", "burst", "concurrency", "speed"]),
                        setting_values, max_size=3),
        st.one_of(st.integers(), st.text(max_size=5), st.none()),  # not a dict at all
    )
    return st.dictionaries(st.one_of(st.sampled_from(keys), st.text(max_size=10)), spec,
                           max_size=3)


origin_overrides = st.dictionaries(
    st.sampled_from(["http://a.test", "http://a.test/", "https://b.test:8443", ""]),
    st.dictionaries(st.sampled_from(["rate", "burst", "origin_rate", "origin_burst", "x"]),
                    setting_values, max_size=4),
    max_size=2,
)
exit_lists = st.one_of(
    st.just(EXIT_URLS),
    st.just(",".join(EXIT_URLS)),
    st.lists(st.one_of(st.sampled_from(EXIT_URLS + ["# a comment", "", "  "]),
                       st.text(max_size=30),
                       st.text(max_size=20).map(lambda t: f"http://{t}"),
                       st.tuples(st.sampled_from(["http", "https", "socks5", "ftp", ""]),
                                 st.text(max_size=12), st.integers(-5, 70000))
                       .map(lambda p: f"{p[0]}://{p[1]}:{p[2]}")),
             max_size=4),
    st.text(max_size=40).map(lambda t: f"http://{t}"),
    # a path that is not a file, "~user" and over-long names included
    st.text(max_size=40).filter(lambda t: "://" not in t),
    st.text(max_size=10).map(lambda t: "~" + t),
    st.just("x" * 300),
    st.integers(),
    st.none(),
)
session_values = st.one_of(st.none(), st.integers(-2, 10**5), st.text(max_size=12),
                           st.lists(st.one_of(st.text(max_size=6), st.integers()), max_size=3))


def check_from_settings(values: dict[str, Any]) -> None:
    try:
        ExitLimitConfig.from_settings(Settings(values))
    except NotConfigured:
        pass
    except ValueError as exc:
        assert "EXITLIMIT_" in str(exc), f"{type(exc).__name__}: {exc}"
        assert "secret" not in str(exc), f"the proxy password leaks: {exc}"


@SETTINGS
@given(st.dictionaries(st.sampled_from(NUMERIC_SETTINGS), setting_values, min_size=1)
       )
def test_numeric_settings_fail_only_with_a_value_error_naming_the_setting(values):
    check_from_settings({"EXITLIMIT_EXITS": EXIT_URLS, **values})


@SETTINGS
@given(
    st.dictionaries(st.sampled_from(NUMERIC_SETTINGS), setting_values, max_size=4)
    ,
    exit_lists,
    # keyed by URL (with credentials too) or by id
    st.one_of(st.none(), exit_overrides([EXIT_URLS[0], EXIT_URLS[1], "127.0.0.1:9000",
                                         make_exit(EXIT_URLS[1]).id])),
    st.one_of(st.none(), origin_overrides),
    session_values,
)
def test_any_settings_fail_only_with_a_value_error_naming_a_setting(numbers, exits, per_exit,
                                                                   per_origin, sessions):
    values: dict[str, Any] = {"EXITLIMIT_EXITS": exits, **numbers}
    if per_exit is not None:
        values["EXITLIMIT_EXIT_SETTINGS"] = per_exit
    if per_origin is not None:
        values["EXITLIMIT_ORIGIN_SETTINGS"] = per_origin
    if sessions is not None:
        values["EXITLIMIT_SESSIONS"] = sessions
    check_from_settings(values)


@SETTINGS
@given(st.dictionaries(st.sampled_from(NUMERIC_SETTINGS),
                       st.one_of(st.integers(1, 100), st.floats(0.5, 100.0),
                                 st.integers(1, 100).map(str)),
                       min_size=1))
def test_sane_numeric_settings_are_accepted_or_refused_as_inconsistent(values):
    """Sane positive numbers only fail on an ordering rule (min above max), never on type."""
    try:
        ExitLimitConfig.from_settings(Settings({"EXITLIMIT_EXITS": EXIT_URLS, **values}))
    except ValueError as exc:
        assert "must not exceed" in str(exc) or "whole number" in str(exc), str(exc)


# -- bugs found by the fuzzers above: each value is refused, with an error naming it -----------


def check_refused(values: dict[str, Any], name: str) -> None:
    """``values`` are refused with a ValueError naming ``name`` (never accepted, never a
    stray error, never the proxy password)."""
    with pytest.raises(ValueError) as refused:
        ExitLimitConfig.from_settings(Settings(values))
    assert name in str(refused.value), str(refused.value)
    assert "secret" not in str(refused.value), f"the proxy password leaks: {refused.value}"


@pytest.mark.parametrize("name", ["EXITLIMIT_RATE", "EXITLIMIT_BURST", "EXITLIMIT_MAX_RATE"])
def test_a_huge_number_is_refused_with_a_value_error(name):
    check_refused({"EXITLIMIT_EXITS": EXIT_URLS, name: 10**400}, name)


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize("name", ["EXITLIMIT_BURST", "EXITLIMIT_BREAKER_THRESHOLD",
                                  "EXITLIMIT_MAX_RETRIES"])
def test_an_infinite_whole_number_is_refused_with_a_value_error_naming_it(name, value):
    check_refused({"EXITLIMIT_EXITS": EXIT_URLS, name: value}, name)


@pytest.mark.parametrize("spec", [{"rate": 10**400}, {"burst": math.inf},
                                  {"concurrency": math.nan}])
def test_a_huge_override_is_refused_with_a_value_error(spec):
    check_refused({"EXITLIMIT_EXITS": EXIT_URLS, "EXITLIMIT_EXIT_SETTINGS": {EXIT_URLS[0]: spec}},
                  "EXITLIMIT_EXIT_SETTINGS")


@pytest.mark.parametrize("name", ["EXITLIMIT_EXIT_SETTINGS", "EXITLIMIT_ORIGIN_SETTINGS"])
@pytest.mark.parametrize("value", ["rate=5", "[1, 2]", [1, 2], 5])
def test_an_override_table_that_is_not_a_dict_names_the_setting(name, value):
    check_refused({"EXITLIMIT_EXITS": EXIT_URLS, name: value}, name)


def test_unknown_override_keys_of_mixed_types_name_the_setting():
    check_refused({"EXITLIMIT_EXITS": EXIT_URLS,
                   "EXITLIMIT_EXIT_SETTINGS": {EXIT_URLS[0]: {1: 2, "speed": 3}}},
                  "EXITLIMIT_EXIT_SETTINGS")


@pytest.mark.parametrize("value", ["~no-such-user-here/exits.txt", "x" * 300])
def test_an_exit_list_path_that_cannot_be_a_file_names_the_setting(value):
    check_refused({"EXITLIMIT_EXITS": value}, "EXITLIMIT_EXITS")


@pytest.mark.parametrize("spec", [{"rate": -1}, {"speed": 1}, {"burst": 0}, 5])
def test_a_scope_error_names_the_setting_not_the_scope(spec):
    with pytest.raises(ValueError, match="EXITLIMIT_SCOPES") as info:
        config_module.ExitLimitConfig.from_settings(Settings({
            "EXITLIMIT_EXITS": EXIT_URLS, "EXITLIMIT_SCOPES": {"sk-live-SECRET": spec}}))
    assert "SECRET" not in str(info.value)


@pytest.mark.parametrize("spec", [{"rate": -1}, {"speed": 1}, 5])
def test_an_override_error_does_not_leak_the_proxy_password(spec):
    check_refused({"EXITLIMIT_EXITS": EXIT_URLS, "EXITLIMIT_EXIT_SETTINGS": {EXIT_URLS[1]: spec}},
                  "EXITLIMIT_EXIT_SETTINGS")


# -- every setting, and the add-on ------------------------------------------------------------

#: settings other than numbers, with the shapes a user may give them
OTHER_VALUES = {
    "EXITLIMIT_ENABLED": st.one_of(st.booleans(), st.sampled_from(["yes", "0", "True", "maybe"]),
                                   setting_values),
    "EXITLIMIT_DEBUG": setting_values,
    "EXITLIMIT_STATS_PER_EXIT": setting_values,
    "EXITLIMIT_STATS_PER_SCOPE": setting_values,
    "EXITLIMIT_SCOPES": st.one_of(setting_values, st.dictionaries(
        st.one_of(st.text(max_size=8), st.integers()),
        st.one_of(setting_values, st.dictionaries(
            st.sampled_from(["rate", "burst", "speed"]), setting_values, max_size=2)),
        max_size=3)),
    "EXITLIMIT_ID_KEY": st.one_of(setting_values, st.text(min_size=14, max_size=40)),
    "EXITLIMIT_POLICY": st.one_of(setting_values, st.sampled_from(
        ["scrapy_exitlimit.policy.ResponsePolicy", "no.such.Policy", "Policy"])),
    "EXITLIMIT_EXIT_IP_HEADER": st.one_of(setting_values, st.sampled_from(["X-Exit-IP", "a b"])),
    "EXITLIMIT_BACKEND": st.one_of(setting_values, st.sampled_from(
        ["memory", "redis", "Redis", "MEMORY", "x.y.Backend", "scrapy_exitlimit.Nope"])),
    "EXITLIMIT_REDIS_URL": st.one_of(setting_values, st.just("redis://127.0.0.1:1/0")),
    "EXITLIMIT_REDIS_PREFIX": st.one_of(setting_values, st.sampled_from(["a{b}", "p"])),
    "EXITLIMIT_REDIS_TIMEOUT": setting_values,
    "EXITLIMIT_REDIS_ON_ERROR": st.one_of(setting_values, st.sampled_from(["local", "pause"])),
    "EXITLIMIT_PROMETHEUS_PORT": setting_values,
    "EXITLIMIT_PROMETHEUS_ADDR": setting_values,
    # not a path: a fuzzed string would create files; types only
    "EXITLIMIT_TELEMETRY": st.one_of(st.none(), st.integers(), st.lists(st.integers(),
                                                                        max_size=1)),
    "EXITLIMIT_STATE_FILE": st.one_of(st.none(), st.integers(), st.booleans(), st.just("a\0b"),
                                      st.lists(st.integers(), max_size=1)),
}
STRUCTURED = {"EXITLIMIT_EXITS", "EXITLIMIT_SESSIONS", "EXITLIMIT_EXIT_SETTINGS",
              "EXITLIMIT_ORIGIN_SETTINGS"}  # fuzzed above, with their own strategies


def test_the_fuzzers_cover_every_setting_the_package_reads():
    from pathlib import Path

    import scrapy_exitlimit

    root = Path(scrapy_exitlimit.__file__).parent
    read = set()
    for path in root.rglob("*.py"):
        if "lab" not in path.parts:
            read |= set(re.findall(r"EXITLIMIT_[A-Z_]+[A-Z]", path.read_text()))
    read -= {"EXITLIMIT_REQUIRE_REDIS"}  # the test suite's, not a setting
    assert read <= set(config_module.SETTINGS), read - set(config_module.SETTINGS)
    fuzzed = set(NUMERIC_SETTINGS) | set(OTHER_VALUES) | STRUCTURED
    assert set(config_module.SETTINGS) == fuzzed, set(config_module.SETTINGS) ^ fuzzed


def check_addon(values: dict[str, Any]) -> None:
    """The add-on reads settings before any component: it too may only fail with a
    ValueError (or NotConfigured) naming a setting."""
    from scrapy_exitlimit.addon import Addon

    settings = Settings(values)
    try:
        Addon().update_settings(settings)
    except ValueError as exc:
        assert "EXITLIMIT_" in str(exc), f"{type(exc).__name__}: {exc}"
        assert "secret" not in str(exc), f"the proxy password leaks: {exc}"


@SETTINGS
@given(st.fixed_dictionaries({}, optional=OTHER_VALUES),
       st.dictionaries(st.sampled_from(NUMERIC_SETTINGS), setting_values, max_size=3))
def test_every_setting_fails_only_with_a_value_error_naming_it(others, numbers):
    values = {"EXITLIMIT_EXITS": EXIT_URLS, **others, **numbers}
    check_from_settings(values)
    check_addon(values)


@SETTINGS
@given(exit_lists, session_values)
def test_the_addon_fails_only_with_a_value_error_naming_a_setting(exits, sessions):
    values: dict[str, Any] = {"EXITLIMIT_EXITS": exits}
    if sessions is not None:
        values["EXITLIMIT_SESSIONS"] = sessions
    check_addon(values)
