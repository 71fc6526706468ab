"""What the operator and the glue see of the state: read-only, no control law."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .origin import OriginState
from .pool import ExitPool
from .state import StateTable


@dataclass(frozen=True)
class ExitLoad:
    """How loaded an exit is now."""

    limit: int  # its in-flight cap now (adaptive; 1 while suspect)
    in_flight: int  # leases held on it, over all origins
    ceiling: int  # the most its cap may grow to (EXITLIMIT_CONCURRENCY, or its own)


def usable(state: StateTable, pool: ExitPool, origin: str, exit_id: str, now: float) -> bool:
    """Whether this exit could serve this origin now: not dead, pair not banned/broken."""
    if pool.states[exit_id].health.dead(now):
        return False
    pair = state.origin(origin).pairs.get(state.aliases.pair_key(exit_id))
    return pair is None or pair.usable(now)


def exit_states(pool: ExitPool, origins: Iterable[OriginState],
                pair_key: Callable[[str], str], now: float) -> dict[str, int]:
    """How many exits are ready, cooling down, banned or dead for these origins: the
    worst state across them counts (dead, then banned, then cooling)."""
    origins = list(origins)
    counts = {"ready": 0, "cooling": 0, "banned": 0, "dead": 0}
    for exit_id, exit_state in pool.states.items():
        state = "ready"
        if exit_state.health.dead(now):
            state = "dead"
        else:
            for origin in origins:
                pair = origin.pairs.get(pair_key(exit_id))
                if pair is None:
                    continue
                if pair.banned_until > now:
                    state = "banned"
                    break
                if pair.cooldown_until > now:
                    state = "cooling"
        counts[state] += 1
    return counts
