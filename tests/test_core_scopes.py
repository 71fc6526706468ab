"""Named scopes in the pure core: budgets shared by every exit, configured or learned."""

import math
import random

import pytest

from scrapy_exitlimit.core import Lease, Limiter, Limits, make_exit
from scrapy_exitlimit.core.bucket import TokenBucket
from scrapy_exitlimit.core.scopes import Scope, scope_id

from .conftest import FakeClock

SITE = "http://site.test"


def exits(n):
    return [make_exit(f"http://127.0.0.1:{9000 + i}") for i in range(n)]


def limiter(n, clock, **kw):
    limits = Limits(**{"rate": 5.0, "burst": 1, "concurrency": 4, **kw})
    return Limiter(exits(n), limits, clock=clock, rng=random.Random(1))


def test_scope_ids_hide_the_name_and_are_stable_under_one_key():
    key = b"k" * 16
    assert scope_id("sk-live-SECRET", key) == scope_id("sk-live-SECRET", key)
    assert "SECRET" not in scope_id("sk-live-SECRET", key)
    assert scope_id("a", key) != scope_id("b", key)
    assert scope_id("a", key).startswith("scope~") and len(scope_id("a", key)) == 18


def test_a_configured_scope_spaces_requests_over_every_exit():
    clock = FakeClock(0.0)
    lim = limiter(4, clock)
    acct = Scope("scope~acct", rate=2.0)
    first = lim.try_admit(SITE, scopes=[acct])
    assert isinstance(first, Lease) and first.scopes == (acct,)
    lim.release(first.id)
    # every exit is free and its pair ready, but the account's next token is 0.5 s on
    assert lim.try_admit(SITE, scopes=[acct]) == pytest.approx(0.51)
    other = lim.try_admit(SITE)  # a request without the scope is not held up
    assert isinstance(other, Lease)
    clock.advance(0.51)
    assert isinstance(lim.try_admit(SITE, scopes=[acct]), Lease)


def test_a_scope_re_anchors_on_its_first_answers_as_they_come():
    """The first requests ride cold connections and may reach the server late; until a
    few answers show what fast is, the next token is an interval after the answer (the
    very first answer is its own fastest, which would put it back at its admission:
    the lab's one 429 per crawl at a configured account rate)."""
    clock = FakeClock(0.0)
    lim = limiter(8, clock)
    acct = Scope("scope~acct", rate=2.0)  # 0.51 s apart with the scope's margin
    first = lim.try_admit(SITE, scopes=[acct])
    assert isinstance(first, Lease)
    clock.advance(0.2)  # a slow, cold answer
    lim.release(first.id)
    assert lim.try_admit(SITE, scopes=[acct]) == pytest.approx(0.71)
    for _ in range(4):  # warm: answers 10 ms after admission
        clock.advance(0.6)
        lease = lim.try_admit(SITE, scopes=[acct])
        assert isinstance(lease, Lease)
        clock.advance(0.01)
        lim.release(lease.id)
    clock.advance(0.6)
    late = lim.try_admit(SITE, scopes=[acct])
    assert isinstance(late, Lease)
    clock.advance(0.2)  # late, but the path takes 10 ms at least: it arrived by now - 0.01
    lim.release(late.id)
    assert lim.try_admit(SITE, scopes=[acct]) == pytest.approx(clock.now - 0.01 + 0.51)


def test_a_request_waiting_for_one_budget_holds_none_of_the_others():
    clock = FakeClock(0.0)
    lim = limiter(2, clock)
    slow, fast = Scope("scope~slow", rate=1.0), Scope("scope~fast", rate=100.0)
    first = lim.try_admit(SITE, scopes=[slow, fast])
    assert isinstance(first, Lease)
    lim.release(first.id)  # answered: the budgets' first answer (no longer gated)
    fast_bucket = lim.scopes.state(fast).bucket
    tat = fast_bucket.tat
    in_flight = sum(e.in_flight for e in lim.exits.values())
    assert lim.try_admit(SITE, scopes=[slow, fast]) > 0.5
    assert fast_bucket.tat == tat  # the fast scope's token was not taken
    assert sum(e.in_flight for e in lim.exits.values()) == in_flight  # nor a lease
    clock.advance(0.0102)
    assert isinstance(lim.try_admit(SITE, scopes=[fast]), Lease)


def test_a_learned_scope_starts_at_the_start_rate():
    lim = limiter(3, FakeClock(0.0), rate=None)
    acct = Scope("scope~acct")
    # paced from its first request at the start rate, a guess the answers prove or lower
    assert [b.rate for _, b in lim.scope_budgets([acct])] == [2.0]


def _crawl(lim, clock, scopes, limit, seconds, latency=0.05):
    """Requests for one account through every exit as fast as the limiter admits them,
    against a server allowing the account ``limit`` r/s (strict GCRA)."""
    server = TokenBucket(limit)
    answers = []  # (time, lease)
    ok = refused = 0
    oks = []
    while clock() < seconds:
        while True:
            got = lim.try_admit(SITE, scopes=scopes)
            if not isinstance(got, Lease):
                break
            answers.append((clock() + latency, got))
        answers.sort(key=lambda a: a[0])
        nxt = min([got if isinstance(got, float) else math.inf,
                   answers[0][0] if answers else math.inf, clock() + 0.01])
        clock.advance(max(nxt - clock(), 1e-4))
        while answers and answers[0][0] <= clock():
            _, lease = answers.pop(0)
            arrived = lease.admitted_at + latency / 2
            if server.ready_at(arrived) <= arrived:
                server.consume(arrived)
                lim.success(lease, latency)
                ok += 1
                oks.append(clock())
            else:
                lim.rate_limited(SITE, lease.exit_id, 0.3, lease)
                refused += 1
            lim.release(lease.id)
    return ok, refused, oks


def test_a_learned_scope_finds_the_accounts_limit_not_the_pairs():
    clock = FakeClock(0.0)
    lim = limiter(10, clock, rate=None)
    acct = Scope("scope~acct")
    ok, refused, oks = _crawl(lim, clock, [acct], 4.0, 150.0)  # about 600 pages
    late = [t for t in oks if t >= 10.0]
    assert refused / (ok + refused) <= 0.03
    assert len(late) / 140.0 >= 0.85 * 4.0
    # the scope learned it; the pairs' pool rate was not dragged under the account's
    assert lim.scope_view()["scope~acct"] == pytest.approx(4.0, rel=0.15)
    assert lim.origins[SITE].learner.site is None


def test_a_configured_scope_draws_no_429s():
    clock = FakeClock(0.0)
    lim = limiter(10, clock, rate=None)
    ok, refused, oks = _crawl(lim, clock, [Scope("scope~acct", rate=4.0)], 4.0, 20.0)
    assert refused == 0
    assert ok / 20.0 >= 0.95 * 4.0


# -- what a learned scope learned, kept for a later run (warm start) ---------------------
def test_a_learned_scopes_rate_is_remembered_once_proven_and_recalled_at_first_use():
    from scrapy_exitlimit.core.warm import Recalled, recall_scopes, remember_scopes

    clock = FakeClock(0.0)
    lim = limiter(10, clock, rate=None)
    acct, fixed = Scope("scope~acct"), Scope("scope~fixed", rate=3.0)
    lim.scope_budgets([acct, fixed])
    assert remember_scopes(lim, offset=1000.0) == {}  # the start rate is a guess, not kept
    _crawl(lim, clock, [acct], 4.0, 60.0)
    kept = remember_scopes(lim, offset=1000.0)
    assert list(kept) == ["scope~acct"]  # a configured scope has nothing to remember
    assert kept["scope~acct"]["at"] == pytest.approx(1000.0 + 60.0, abs=0.1)  # wall clock
    learned = kept["scope~acct"]["rate"]
    assert learned["clean"] == pytest.approx(4.0, rel=0.15)

    later = limiter(10, FakeClock(0.0), rate=None)
    got = Recalled()
    recall_scopes(later, {**kept, "scope~old": {"at": 0.0, "rate": learned}}, got,
                  wall_now=1100.0, max_age=1000.0)
    assert (got.scopes, got.stale_scopes) == (1, 1)  # older than the max age: ignored
    # met again: paced at once at what ran clean, no start rate to prove
    [(_, bucket)] = later.scope_budgets([acct])
    assert bucket.rate == pytest.approx(learned["clean"])
    assert later.scopes.learned("scope~acct").site.proven
    assert "scope~old" not in later.scopes.recalled
    # a scope that has a configured rate now keeps it
    later.scopes.recalled["scope~fixed"] = learned
    [(_, bucket)] = later.scope_budgets([fixed])
    assert bucket.rate == 3.0
