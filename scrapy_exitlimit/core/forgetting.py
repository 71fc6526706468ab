"""Forgetting idle state, so long crawls over many origins stay in bounded memory.

A pair idle for ``PAIR_IDLE`` with nothing left to say (no lease, cooldown,
ban, token held ahead, or limit of its own beyond a configured one, and not the
scout) is dropped; so is an origin idle for ``ORIGIN_IDLE`` with no lease, what it
learned included. Dropped state is made afresh when needed, as new.
"""

from __future__ import annotations

from collections.abc import Callable

from .origin import OriginState
from .sharing import pristine

#: pair state untouched this long (seconds), with nothing to remember, is dropped
PAIR_IDLE = 600.0
#: origin state untouched this long is dropped, what it learned included
ORIGIN_IDLE = 3600.0


def forget_idle(origins: dict[str, OriginState], busy: set[str], now: float,
                configured_rate: Callable[[str, str], float | None]) -> int:
    """Drop idle state from ``origins`` (``busy``: origins with a lease in flight);
    returns how many pairs were dropped."""
    dropped = 0
    for key in list(origins):
        origin = origins[key]
        if key not in busy and now - origin.last_used > ORIGIN_IDLE:
            dropped += len(origin.pairs)
            del origins[key]
            continue
        for pair_key, pair in list(origin.pairs.items()):
            own = pair.own_limit
            if (pair.in_flight == 0 and now - pair.last_admit > PAIR_IDLE
                    and pair.cooldown_until < now and pair.banned_until < now
                    # a schedule still ahead (a warm start's stagger, made before the
                    # pair's first admission) is something to say
                    and pair.bucket.ready_at(now) <= now
                    and pair_key != origin.scout
                    and (own is None or pristine(own, configured_rate(key, pair_key)))):
                del origin.pairs[pair_key]
                dropped += 1
    return dropped
