import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scrapy.http import Headers

from scrapy_exitlimit.core.ratelimit_headers import (
    RATELIMIT_HEADERS,
    Quota,
    parse_ratelimit,
)

NOW = 1767225000.0  # 2025-12-31T23:50:00Z


def q(limit=None, window=None, remaining=None, reset=None):
    return Quota(limit=limit, window=window, remaining=remaining, reset=reset)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        # --- GitHub / Twitter style X-RateLimit-* ---
        pytest.param(
            {
                "x-ratelimit-limit": "5000",
                "x-ratelimit-remaining": "4999",
                "x-ratelimit-reset": "1767225600",  # epoch, 600 s after NOW
                "x-ratelimit-used": "1",
                "x-ratelimit-resource": "core",
            },
            q(5000, None, 4999, 600),
            id="github",
        ),
        pytest.param(
            {"X-RateLimit-Limit": "60", "X-RateLimit-Remaining": "59", "X-RateLimit-Reset": "30"},
            q(60, None, 59, 30),
            id="x-reset-delta",
        ),
        pytest.param(
            {"X-RateLimit-Reset": "1767220000"}, q(reset=0.0), id="x-reset-epoch-in-past"
        ),
        pytest.param(
            {"X-RateLimit-Reset": "1767225600", "X-RateLimit-Reset-After": "0.5"},
            q(reset=0.5),
            id="x-reset-after-preferred",
        ),
        pytest.param(
            {"X-RateLimit-Limit": "5", "X-RateLimit-Remaining": "4", "X-RateLimit-Reset": "1.25"},
            q(5, None, 4, 1.25),
            id="decimals",
        ),
        pytest.param(
            {"X-RateLimit-Limit": "100", "X-RateLimit-Window": "60"}, q(100, 60), id="window"
        ),
        pytest.param(
            {"X-RateLimit-Limit": "100", "X-RateLimit-Window": "60s"}, q(100, 60), id="window-s"
        ),
        pytest.param(
            {"X-RateLimit-Limit": "100", "X-RateLimit-Period": "1m"}, q(100, 60), id="period-m"
        ),
        pytest.param(
            {"X-RateLimit-Limit": "100", "X-RateLimit-Period": "1h"}, q(100, 3600), id="period-h"
        ),
        pytest.param(
            {"X-RateLimit-Limit": "10", "X-RateLimit-Window": "500ms"}, q(10, 0.5), id="window-ms"
        ),
        pytest.param(
            {"X-Rate-Limit-Limit": "900", "X-Rate-Limit-Remaining": "899",
             "X-Rate-Limit-Reset": "1767225900"},
            q(900, None, 899, 900),
            id="twitter-x-rate-limit",
        ),
        pytest.param(
            {"X-Rate-Limit-Reset": "Thu, 01 Jan 2026 00:00:00 GMT"},
            q(reset=600),
            id="x-rate-limit-reset-http-date",
        ),
        # --- IETF draft 06: separate fields ---
        pytest.param(
            {"RateLimit-Limit": "10", "RateLimit-Remaining": "5", "RateLimit-Reset": "30"},
            q(10, None, 5, 30),
            id="draft06-no-window-guessed",
        ),
        pytest.param(
            {"RateLimit-Limit": "10, 10;w=1, 1000;w=3600", "RateLimit-Remaining": "5",
             "RateLimit-Reset": "30"},
            q(1000, 3600, 5, 30),
            id="draft06-limit-with-policies",
        ),
        pytest.param(
            {"RateLimit-Limit": "10", "RateLimit-Remaining": "6", "RateLimit-Reset": "3",
             "RateLimit-Policy": '10;w=5, 80;w=60;comment="bar"'},
            q(80, 60, 6, 3),
            id="draft06-separate-policy-field",
        ),
        # --- IETF draft 07: RateLimit dictionary + RateLimit-Policy (examples from the draft) ---
        pytest.param(
            {"RateLimit-Policy": "100;w=10", "RateLimit": "limit=100, remaining=50, reset=5"},
            q(100, 10, 50, 5),
            id="draft07-section-3.5",
        ),
        pytest.param(
            {"RateLimit": "limit=10, remaining=1, reset=7"},
            q(10, None, 1, 7),
            id="draft07-no-policy",
        ),
        pytest.param(
            {"RateLimit-Policy": "10;w=1, 50;w=60, 1000;w=3600, 5000;w=86400",
             "RateLimit": "limit=10, remaining=9, reset=1"},
            q(5000, 86400, 9, 1),
            id="draft07-four-policies-most-restrictive",
        ),
        pytest.param(
            {"RateLimit-Policy": "10;w=1;burst=1000, 1000;w=3600"},
            q(1000, 3600),
            id="draft07-burst-param-ignored",
        ),
        pytest.param(
            {"RateLimit-Policy": '100;w=60;comment="fixed window"'},
            q(100, 60),
            id="draft07-comment-param",
        ),
        pytest.param(
            {"RateLimit-Policy": '12;w=1;burst=1000;policy="leaky bucket"'},
            q(12, 1),
            id="draft07-quoted-param-with-space",
        ),
        pytest.param(
            {"RateLimit": "limit=10, remaining=0, reset=10"},
            q(10, None, 0, 10),
            id="draft07-exhausted",
        ),
        # --- IETF draft 08+: structured fields (examples from the draft) ---
        pytest.param(
            {"RateLimit-Policy": '"default";q=100;w=10', "RateLimit": '"default";r=50;t=30'},
            q(100, 10, 50, 30),
            id="draft08-default",
        ),
        pytest.param(
            {"RateLimit-Policy": '"burst";q=100;w=60,"daily";q=1000;w=86400'},
            q(1000, 86400),
            id="draft08-burst-daily",
        ),
        pytest.param(
            {"RateLimit-Policy": '"permin";q=50;w=60,"perhr";q=1000;w=3600',
             "RateLimit": '"perhr";r=10;t=30'},
            q(1000, 3600, 10, 30),
            id="draft08-permin-perhr",
        ),
        pytest.param(
            {"RateLimit-Policy": '"peruser";q=100;w=60;pk=:cHsdsRa894==:'},
            q(100, 60),
            id="draft08-partition-key",
        ),
        pytest.param(
            {"RateLimit-Policy": '"peruser";q=65535;qu="bytes";w=10;pk=:sdfjLJUOUH==:'},
            None,
            id="draft08-bytes-quota-only",
        ),
        pytest.param(
            {"RateLimit-Policy":
                '"bw";q=65535;qu="content-bytes";w=1, "api";q=60;qu="requests";w=60'},
            q(60, 60),
            id="draft08-non-request-units-skipped",
        ),
        pytest.param(
            {"RateLimit": '"default";r=999;pk=:dHJpYWwxMjEzMjM=:'},
            q(remaining=999),
            id="draft08-no-reset",
        ),
        pytest.param(
            {"RateLimit": '"problemPolicy";r=0;t=10'}, q(remaining=0, reset=10), id="draft08-r0"
        ),
        pytest.param(
            {"RateLimit-Policy": '"a";q=10;w=1, "b";q=100;w=3600',
             "RateLimit": '"a";r=5;t=1, "b";r=70;t=1000'},
            q(100, 3600, 70, 1000),
            id="draft08-ratelimit-matched-by-name",
        ),
        pytest.param(
            {"RateLimit-Policy": '"a";q=10;w=1, "b";q=100;w=3600',
             "RateLimit": '"x";r=5;t=1, "y";r=70;t=1000'},
            q(100, 3600, 5, 1),
            id="draft08-no-name-match-first",
        ),
        pytest.param(
            {"RateLimit-Policy": '"a";q=10;w=1, "b";q=100;w=3600',
             "RateLimit": '"a";r=0;t=1, "b";r=70;t=1000'},
            q(100, 3600, 0, 1),
            id="draft08-exhausted-policy-wins",
        ),
        pytest.param(
            {"RateLimit-Policy": '"default";q=100', "RateLimit": '"default";r=50;t=30'},
            q(100, None, 50, 30),
            id="draft08-policy-without-window",
        ),
        pytest.param(
            {"RateLimit-Policy": "default;q=100;w=60", "RateLimit": "default;r=50;t=5"},
            q(100, 60, 50, 5),
            id="draft08-token-names",
        ),
        # --- leniency: case, whitespace, mixed forms ---
        pytest.param(
            {"ratelimit-policy": ' "Default" ; Q=100 ; W=10 ',
             "RATELIMIT": '"default"; R=50; T=30'},
            q(100, 10, 50, 30),
            id="case-and-whitespace",
        ),
        pytest.param(
            {"RateLimit-Policy": '"default";q=100;w=10', "RateLimit": '"default";r=50;t=30',
             "X-RateLimit-Limit": "5", "X-RateLimit-Remaining": "1", "X-RateLimit-Reset": "9"},
            q(100, 10, 50, 30),
            id="ietf-beats-x",
        ),
        pytest.param(
            {"X-RateLimit-Limit": "100, 100;w=60"}, q(100, 60), id="x-limit-with-ietf-policy"
        ),
        # --- bytes keys and values ---
        pytest.param(
            {b"X-RateLimit-Limit": b"60", b"X-RateLimit-Remaining": b"59",
             b"X-RateLimit-Reset": b"1767225060"},
            q(60, None, 59, 60),
            id="bytes",
        ),
        pytest.param(
            {b"RATELIMIT-POLICY": b'"d";q=10;w=2', b"ratelimit": b'"d";r=3;t=1'},
            q(10, 2, 3, 1),
            id="bytes-case-insensitive",
        ),
        pytest.param(
            {"X-RateLimit-Limit": [b"60", b"70"], "X-RateLimit-Remaining": [b"10"]},
            q(60, None, 10),
            id="list-values-first-wins",
        ),
    ],
)
def test_parse(headers, expected):
    assert parse_ratelimit(headers, now=NOW) == expected


def test_scrapy_headers():
    headers = Headers(
        {
            "X-RateLimit-Limit": "5000",
            "X-RateLimit-Remaining": "4999",
            "X-RateLimit-Reset": "1767225600",
        }
    )
    assert parse_ratelimit(headers, now=NOW) == q(5000, None, 4999, 600)


def test_scrapy_headers_repeated_policy_lines_combine():
    headers = Headers()
    headers.appendlist("RateLimit-Policy", '"burst";q=10;w=1')
    headers.appendlist("RateLimit-Policy", '"daily";q=1000;w=86400')
    headers["RateLimit"] = '"daily";r=900;t=3600'
    assert parse_ratelimit(headers, now=NOW) == q(1000, 86400, 900, 3600)


def test_get_only_mapping():
    class GetOnly:
        def __init__(self, data):
            self.data = data

        def get(self, name):
            return self.data.get(name)

    headers = GetOnly({b"RateLimit-Policy": b"100;w=10", "ratelimit": "limit=100, remaining=5"})
    assert parse_ratelimit(headers, now=NOW) == q(100, 10, 5)


def test_items_that_raise_fall_back_to_get():
    class Broken(dict):
        def items(self):
            raise RuntimeError("boom")

    assert parse_ratelimit(Broken({"X-RateLimit-Limit": "3"}), now=NOW) == q(3)


@pytest.mark.parametrize(
    "headers",
    [
        None,
        42,
        "X-RateLimit-Limit: 5",
        {},
        {"Content-Type": "text/html", "Retry-After": "5"},
        {"X-RateLimit-Limit": None},
        {"X-RateLimit-Limit": []},
        {"X-RateLimit-Limit": object()},
    ],
)
def test_absent_is_none(headers):
    assert parse_ratelimit(headers, now=NOW) is None


GARBAGE = [
    "", " ", "-1", "-0.5", "NaN", "nan", "inf", "-inf", "Infinity", "abc", "1e3", "1_000",
    "0x10", "9" * 400, "1e999", '"unbalanced', '"a";q="10', "10;w=", ";;;", ",,,", "=",
    "limit=", "\x00\xff", "\u2603", '"\\', "1.2.3",
]


@pytest.mark.parametrize("value", GARBAGE)
@pytest.mark.parametrize("name", RATELIMIT_HEADERS)
def test_garbage_never_raises(name, value):
    result = parse_ratelimit({name: value}, now=NOW)
    assert result is None or all(
        v is None or (math.isfinite(v) and v >= 0)
        for v in (result.limit, result.window, result.remaining, result.reset)
    )


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"X-RateLimit-Limit": "-1", "X-RateLimit-Remaining": "5"}, q(remaining=5)),
        ({"X-RateLimit-Limit": "NaN", "X-RateLimit-Reset": "abc"}, None),
        ({"X-RateLimit-Limit": "10", "X-RateLimit-Window": "forever"}, q(10)),
        ({"X-RateLimit-Limit": "10", "X-RateLimit-Window": "-60"}, q(10)),
        ({"RateLimit-Policy": "10;w=-1"}, q(10)),
        ({"RateLimit-Policy": '"a";q=abc;w=60, "b";q=5;w=10'}, q(5, 10)),
        ({"RateLimit-Policy": '"unbalanced;q=5;w=10'}, None),
        ({"RateLimit-Policy": '"ok";q=5;w=10, "bad'}, q(5, 10)),
        ({"RateLimit": "limit=inf, remaining=-3, reset=7"}, q(reset=7)),
        ({"RateLimit": '"d";r=NaN;t=5'}, q(reset=5)),
        ({"X-RateLimit-Limit": "9" * 400}, None),
        ({"X-RateLimit-Reset": "1e999"}, None),
    ],
)
def test_garbage_fields_become_none(headers, expected):
    assert parse_ratelimit(headers, now=NOW) == expected


@pytest.mark.parametrize(
    ("quota", "rate"),
    [
        (q(100, 10, 50, 5), 10.0),  # the stated policy, whatever remains
        (q(5000, 86400, 9, 1), 5000 / 86400),
        (q(5000, None, 4999, 600), None),  # no window: no policy rate
        (q(10, None, 0, 10), None),
        (q(None, 60, 5, 10), None),
        (q(0, 60, 5, 10), None),  # a zero limit is no rate to pace at
        (q(10, 0), None),
        (q(), None),
    ],
)
def test_rate(quota, rate):
    assert quota.rate == (None if rate is None else pytest.approx(rate))


def test_rate_from_parsed_headers():
    quota = parse_ratelimit(
        {"RateLimit-Policy": '"permin";q=50;w=60,"perhr";q=1000;w=3600'}, now=NOW
    )
    assert quota is not None
    assert quota.rate == pytest.approx(1000 / 3600)


def _finite_or_none(value):
    return value is None or (isinstance(value, float) and math.isfinite(value) and value >= 0)


@settings(max_examples=300, deadline=None)
@given(
    values=st.dictionaries(
        st.sampled_from(RATELIMIT_HEADERS),
        st.one_of(
            st.text(max_size=60),
            st.text(alphabet='0123456789.,;="qwrt- abc:', max_size=60),
            st.binary(max_size=40),
        ),
    ),
    now=st.floats(min_value=0, max_value=4e9),
)
def test_arbitrary_text_never_raises(values, now):
    quota = parse_ratelimit(values, now=now)
    if quota is None:
        return
    for value in (quota.limit, quota.window, quota.remaining, quota.reset):
        assert _finite_or_none(value)
    assert _finite_or_none(quota.rate)


def _x_headers(limit, remaining, reset):
    return {"X-RateLimit-Limit": str(limit), "X-RateLimit-Remaining": str(remaining),
            "X-RateLimit-Reset": str(reset)}


@pytest.mark.parametrize("epoch", [False, True], ids=["seconds", "epoch"])
def test_a_window_is_learned_the_first_time_it_resets(epoch):
    from scrapy_exitlimit.core.ratelimit_headers import QuotaWindows

    now = 1_700_000_000.0
    windows = QuotaWindows()

    def rate(remaining, reset_in, at):
        reset = at + reset_in if epoch else reset_in
        return windows.rate("pair", parse_ratelimit(_x_headers(60, remaining, reset), now=at))

    # 60 per window ending at Reset: no window length stated, nothing to pace by yet
    assert rate(12, 7, now) is None
    assert rate(11, 6, now + 1) is None
    assert rate(59, 30, now + 7) == pytest.approx(2.0)  # a new window: 30 s long
    assert rate(58, 29, now + 8) == pytest.approx(2.0)
    assert windows.rate("other", parse_ratelimit(_x_headers(60, 3, 5), now=now)) is None
    stated = parse_ratelimit({"RateLimit-Policy": "10;w=5", "RateLimit-Remaining": "3"},
                             now=now)
    assert windows.rate("pair", stated) == pytest.approx(2.0)  # a stated policy wins


def test_an_epoch_reset_reads_the_whole_seconds_of_its_window_however_late_in_a_second():
    from scrapy_exitlimit.core.ratelimit_headers import QuotaWindows

    def reading(at: float, window: float, latency: float = 0.004) -> float | None:
        # 4 per window; the answer to the request that opened it (at, server time; half
        # the latency each way), the window's end stated as a whole epoch second
        windows = QuotaWindows()
        end = math.ceil(at + window)
        now = at + latency / 2
        quota = parse_ratelimit(_x_headers(4, 3, end), now=now)
        assert windows.rate("pair", quota, latency) is not None
        return windows.windows["pair"]

    base = 1_700_000_000.0
    for frac in (0.0, 0.003, 0.1, 0.5, 0.9, 0.997):  # where in its second it opened
        for window in (1.0, 5.0, 60.0):
            # ceil(reset) would read 2, 6 and 61 s for all but a window opening on the second
            assert reading(base + frac, window) == window, (frac, window)
    # a window opening within the request's way there after a second began reads a
    # second long (the safe side); a later window, opening elsewhere, reads it right
    assert reading(base + 0.001, 1.0) == 2.0
    assert QuotaWindows().rate("pair", parse_ratelimit(_x_headers(4, 3, 1), now=base),
                               0.003) == pytest.approx(4.0)  # a delta of 1 s: 1 s


def test_the_shortest_reading_is_the_window():
    from scrapy_exitlimit.core.ratelimit_headers import QuotaWindows

    windows = QuotaWindows()
    now = 1_700_000_000.0

    def opened(reset, latency):
        return windows.rate("pair", parse_ratelimit(_x_headers(60, 59, reset), now=now),
                            latency)

    assert opened(30.9, 0.2) == pytest.approx(60 / 31)  # 31.1: 31 s (at most that)
    assert opened(30.0, 0.01) == pytest.approx(2.0)  # 30 s
    assert opened(30.9, 0.01) == pytest.approx(2.0)  # a longer reading changes nothing
    assert windows.windows["pair"] == 30.0


def test_a_reordered_answer_within_a_window_is_not_read_as_its_opening():
    from scrapy_exitlimit.core.ratelimit_headers import QuotaWindows

    windows = QuotaWindows()
    now = 1_700_000_000.0

    def rate(remaining, reset):
        return windows.rate("pair", parse_ratelimit(_x_headers(60, remaining, reset), now=now))

    assert rate(58, 30) is None  # not the opening answer: no reading
    assert rate(57, 29) is None
    # an earlier request's answer came late: remaining up, reset up by a second
    assert rate(59 - 1, 30) is None and "pair" not in windows.windows
    assert rate(20, 2) is None
    assert rate(50, 30) == pytest.approx(2.0)  # remaining and reset both jumped: it opened


def test_header_names_are_read_alike_however_often_and_the_memo_stays_bounded():
    """Header names are matched through a memo: the same answer every time, in any case
    or spacing, and servers sending ever new names do not grow it without bound."""
    from scrapy_exitlimit.core import ratelimit_headers as rh

    for _ in range(3):
        quota = parse_ratelimit(Headers({b"X-RateLimit-Remaining": b"7",
                                         b" x-ratelimit-limit ": b"10"}), now=0.0)
        assert quota is not None and quota.remaining == 7 and quota.limit == 10
    bound = rh._wanted_name_memo.cache_info().maxsize
    for n in range(bound + 10):
        assert parse_ratelimit({f"X-Other-{n}": "1"}, now=0.0) is None
    assert rh._wanted_name_memo.cache_info().currsize <= bound
    assert parse_ratelimit({"RateLimit-Remaining": "3"}, now=0.0).remaining == 3
