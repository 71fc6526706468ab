"""The exit pool: each exit's lease count, adaptive cap and health, and which exits
this process may admit on."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .exits import Exit
from .health import START_LIMIT, ConcurrencyLimit, ExitHealth
from .limits import Limits


@dataclass
class ExitState:
    exit: Exit
    concurrency: ConcurrencyLimit
    health: ExitHealth
    in_flight: int = 0
    #: origins whose heap set this exit aside until a lease on it is released
    waiting: set[str] = field(default_factory=set)

    @property
    def limit(self) -> int:
        return 1 if self.health.suspect else self.concurrency.limit

    def usable(self, now: float) -> bool:
        return not self.health.dead(now) and self.in_flight < self.limit


class ExitPool:
    """The exits in configured order, and the ones this process may admit on."""

    def __init__(self, exits: Sequence[Exit], limits: Limits, *, evict_after: int,
                 reanimate_after: float) -> None:
        self.states: dict[str, ExitState] = {
            ex.id: ExitState(
                ex,
                ConcurrencyLimit(limits.exit_concurrency(ex.id),
                                 min(START_LIMIT, limits.exit_concurrency(ex.id))),
                ExitHealth(evict_after=evict_after, backoff=reanimate_after),
            )
            for ex in exits
        }
        self.order = list(self.states)
        #: the exits this process may admit on (None: all); see ``restrict``
        self.allowed: frozenset[str] | None = None
        #: this process is CPU-bound (the glue says so): exits' limits shrink, none grows
        self.busy = False

    def restrict(self, exit_ids: Iterable[str] | None) -> None:
        """Admit only on these exits from now on (None: on every exit again)."""
        self.allowed = None if exit_ids is None else frozenset(exit_ids)

    def allows(self, exit_id: str) -> bool:
        return self.allowed is None or exit_id in self.allowed

    def members(self, pinned: str | None = None) -> Iterable[tuple[str, ExitState]]:
        """The exits to search: the one a request is pinned to (if allowed), else every
        allowed exit (in configured order when all are)."""
        if pinned is not None:
            return ((pinned, self.states[pinned]),) if self.allows(pinned) else ()
        if self.allowed is None:
            return self.states.items()
        return ((e, self.states[e]) for e in self.allowed)

    def alive(self, now: float) -> bool:
        """Whether any exit is not evicted."""
        return any(not e.health.dead(now) for e in self.states.values())

    def __len__(self) -> int:
        return len(self.states)
