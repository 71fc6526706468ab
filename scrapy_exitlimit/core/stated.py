"""What the server states about its limit (RateLimit / X-RateLimit-* headers).

Headers are a hint, answers the truth:

1. A stated rate (clamped to the learned bounds, and under a configured rate,
   which stays a ceiling) becomes the pair's own limit, with no probing above it.
2. An exhausted quota (remaining < 1) holds the pair until the reset, so the
   429 never comes.
3. A 429 at or under the stated rate proves the statement wrong for this pair,
   and it is ignored until the headers say something else. Learning takes over
   where it stood without it: the pool's rate (one scout probing for every exit;
   each pair bisecting from the stated rate on its own drew 429s on every exit),
   or the configured rate. 429s to requests sent before, at the stated pace,
   teach nothing more.
"""

from __future__ import annotations

from .pair import PairState


def rate_stated(pair: PairState, rate: float, *, min_rate: float, max_rate: float,
                configured: float | None) -> float | None:
    """Rule 1: returns the rate to make the pair's own limit, or None when nothing
    changed (the same statement again, or one a 429 contradicted)."""
    rate = min(max(rate, min_rate), max_rate)
    if configured is not None:
        rate = min(rate, configured)
    learning = pair.learning
    if rate == learning.announced or rate == learning.distrusted:
        return None
    learning.announced, learning.distrusted = rate, None
    return rate


def contradicted(pair: PairState, admitted_rate: float, now: float) -> float | None:
    """Rule 3: a 429 to a request admitted at ``admitted_rate``. Returns the statement
    it proved wrong (the caller gives the pair its limit back), or None."""
    learning = pair.learning
    stated = learning.announced
    if stated is None or admitted_rate > stated * (1 + 1e-9):
        return None
    learning.announced, learning.distrusted = None, stated
    learning.distrusted_at = now
    return stated


def sent_at_stated_pace(pair: PairState, admitted_at: float) -> bool:
    """Rule 3: a request sent before its statement was found wrong."""
    return admitted_at <= pair.learning.distrusted_at
