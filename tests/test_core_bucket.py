import math

import pytest

from scrapy_exitlimit.core import TokenBucket


def test_strict_bucket_spaces_tokens_by_the_interval():
    b = TokenBucket(rate=5, burst=1)
    assert b.ready_at(10.0) == 10.0
    b.consume(10.0)
    assert b.ready_at(10.0) == pytest.approx(10.2)
    assert b.ready_at(10.199) == pytest.approx(10.2)
    b.consume(10.2)
    assert b.ready_at(10.2) == pytest.approx(10.4)


def test_burst_allows_that_many_at_once_then_paces():
    b = TokenBucket(rate=2, burst=3)
    for _ in range(3):
        assert b.ready_at(0.0) == 0.0
        b.consume(0.0)
    assert b.ready_at(0.0) == pytest.approx(0.5)
    # idle for a long time refills to burst, not beyond
    for _ in range(3):
        assert b.ready_at(100.0) == 100.0
        b.consume(100.0)
    assert b.ready_at(100.0) == pytest.approx(100.5)


def test_late_consumption_does_not_bank_credit():
    b = TokenBucket(rate=5, burst=1)
    b.consume(0.0)
    b.consume(0.5)  # 0.3 s late: the next token is 0.2 s after *this* one
    assert b.ready_at(0.5) == pytest.approx(0.7)


def test_margin_widens_every_interval():
    b = TokenBucket(rate=5, burst=1, margin=0.01)
    b.consume(0.0)
    assert b.ready_at(0.0) == pytest.approx(0.21)
    assert b.interval == pytest.approx(0.21)


def test_hold_until_gives_one_token_then_paces_no_burst():
    b = TokenBucket(rate=10, burst=5)
    b.hold_until(3.0)
    assert b.ready_at(2.0) == pytest.approx(3.0)
    b.consume(3.0)
    assert b.ready_at(3.0) == pytest.approx(3.1)


def test_hold_until_never_moves_earlier():
    b = TokenBucket(rate=1, burst=1)
    b.hold_until(10.0)
    b.hold_until(5.0)
    assert b.ready_at(0.0) == pytest.approx(10.0)


def test_set_rate_keeps_position():
    b = TokenBucket(rate=1, burst=1)
    b.consume(0.0)
    b.set_rate(10)
    assert b.ready_at(0.0) == pytest.approx(1.0)  # position kept, new interval from here
    b.consume(1.0)
    assert b.ready_at(1.0) == pytest.approx(1.1)


def test_a_slower_rate_does_not_free_a_burst():
    """Halving the rate doubles the tolerance; the tokens just spent must stay spent."""
    b = TokenBucket(rate=10, burst=5)
    for _ in range(5):
        b.consume(0.0)
    assert b.ready_at(0.0) == pytest.approx(0.1)
    b.set_rate(5)
    assert b.ready_at(0.0) == pytest.approx(0.1)  # not 0.0 with two more tokens
    b.consume(0.1)
    assert b.ready_at(0.1) == pytest.approx(0.3)  # then paced at the new rate


def test_a_slower_rate_keeps_a_hold():
    b = TokenBucket(rate=10, burst=4)
    b.hold_until(3.0)
    b.set_rate(2)
    assert b.ready_at(0.0) == pytest.approx(3.0)
    b.consume(3.0)
    assert b.ready_at(3.0) == pytest.approx(3.5)  # one, not a burst


@pytest.mark.parametrize("rate", [0, -1, math.inf, math.nan])
def test_bad_rate_is_refused(rate):
    with pytest.raises(ValueError, match="rate"):
        TokenBucket(rate=rate)


def test_bad_burst_is_refused():
    with pytest.raises(ValueError, match="burst"):
        TokenBucket(rate=1, burst=0)
