"""Feedback returns typed state changes (what a shared backend copies) apart from its events."""

import random

import pytest

from scrapy_exitlimit.core import Lease, Limiter, Limits, Tuning, make_exit
from scrapy_exitlimit.core.changes import (
    ExitEvicted,
    Hold,
    LearningChanged,
    OriginHeld,
    PairHeld,
)

from .conftest import FakeClock

SITE = "http://site.test"


def limiter(clock, **limits):
    exits = [make_exit(f"http://127.0.0.1:{9000 + i}") for i in range(2)]
    return Limiter(exits, Limits(**{"rate": 5.0, **limits}), clock=clock,
                   tuning=Tuning(ban_cooldown=60.0, evict_after=2), rng=random.Random(1))


def test_a_429_holds_the_pair_and_says_until_when():
    clock = FakeClock(0.0)
    lim = limiter(clock, burst=3)
    lease = lim.try_admit(SITE)
    fb = lim.rate_limited(SITE, lease.exit_id, 2.0, lease)
    pair = lim.pair_state(SITE, lease.exit_id)
    assert fb.changes[0] == PairHeld(SITE, lease.exit_id, lease.exit_id, Hold.COOLDOWN,
                                     2.0, pair.bucket.tolerance)
    assert pair.bucket.tolerance == pytest.approx(0.4)  # the hold carries the burst


def test_a_ban_an_eviction_and_a_stated_503_pause_are_changes_a_backend_copies():
    clock = FakeClock(0.0)
    lim = limiter(clock)
    lease = lim.try_admit(SITE)
    assert lim.banned(lease).changes == [
        PairHeld(SITE, lease.exit_id, lease.exit_id, Hold.BAN, 60.0, 0.0)]
    other = lim.try_admit(SITE)
    assert isinstance(other, Lease)
    fb = lim.overloaded(other, retry_after=3.0)
    assert OriginHeld(SITE, 3.0, 0.0) in fb.changes and fb.learned()
    assert [c for c in lim.overloaded(other, retry_after=3.0).changes] == []  # same event
    assert lim.proxy_fault(None, lease.exit_id, SITE).changes == []
    evicted = lim.proxy_fault(None, lease.exit_id, SITE).changes
    dead_until = lim.exits[lease.exit_id].health.dead_until
    assert evicted == [ExitEvicted(lease.exit_id, dead_until)] and dead_until > 0


def test_what_was_learned_is_a_change_and_what_was_not_is_none():
    clock = FakeClock(0.0)
    lim = limiter(clock)
    lease = lim.try_admit(SITE)
    clock.advance(0.05)
    fb = lim.success(lease, 0.05)
    assert not fb.learned()  # a configured rate, nothing new
    fb = lim.announced(lease, 2.0, None, None)  # the server states a lower rate
    assert [e.kind for e in fb.events] == ["rate_announced"]
    assert fb.changes == [LearningChanged(SITE)]
    assert lim.announced(lease, 2.0, None, None).changes == []  # said again: nothing new
