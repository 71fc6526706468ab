"""Exit search: which exit takes the next request for an origin.

Every search judges exits the same way (``eligibility.judge``); they differ in
how many exits they look at and which ready one they prefer:

- **scan** (pools up to ``INDEX_ABOVE`` exits, and a pinned exit): every exit;
  the least loaded ready one, then the one whose pair has waited longest
  (earliest token, as paced now), the first in pool order on a tie. An exit more
  loaded than a ready one already found is passed over unjudged (judging paces
  its pair: most of an admission's cost on a small pool).
- **heap** (larger pools): O(log exits). Exits wait on a heap by the time they
  could next be admitted (a lower bound, checked when taken); those whose time
  has come move onto a stack of ready exits, and the one used most recently is
  taken first. So a crawl keeps a working set of warm exits (open connections,
  proven pairs) and brings in cold ones only when the warm ones are paced out:
  under a rate limit that still spreads the load over as many exits as it
  needs. An exit at its lease limit, or waiting for its pair's answer, is set
  aside until a release on it puts it back.
- **plan** (for a shared backend, whose shared state checks tokens and leases):
  the exits local knowledge does not rule out, least loaded first, then the
  pair admitted longest ago. Large pools are looked at round robin, from where
  the last plan stopped, until enough are found: the cost follows the number
  asked for, not the pool's size.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from .eligibility import PairRules, Verdict, judge, judge_pair, settled
from .pair import PairState
from .pool import ExitPool, ExitState

#: a search returns this wait when only a lease release (or an answer) can help
UNTIL_RELEASE = math.inf
#: pools larger than this are searched through a per-origin heap, not a scan
INDEX_ABOVE = 64

_READY, _DEAD, _LATER = Verdict.READY, Verdict.DEAD, Verdict.LATER
_FULL = Verdict.FULL


@dataclass(frozen=True)
class Candidate:
    """An exit a shared backend may admit on: its pair's pacing and the exit's lease cap."""

    exit_id: str
    interval: float  # seconds between the pair's requests (GCRA emission interval)
    tolerance: float  # how far ahead of schedule a burst may run
    limit: int  # the exit's in-flight cap
    pair: str  # where the pair's state lives: the exit IP when known, else the exit id


class PlanRules(PairRules):
    def pair_key(self, exit_id: str) -> str:
        """Where the exit's pair state lives (its exit IP when known)."""


@dataclass
class Search:
    """Where one origin's exit search stands: the heap's exits, and the plan's position."""

    #: exits not ready before a time: (time, order pushed, exit id)
    heap: list[tuple[float, int, str]] = field(default_factory=list)
    ready: list[str] = field(default_factory=list)  # ready exits, the warmest last
    queued: set[str] = field(default_factory=set)  # exits on the heap or the stack
    plan_from: int = 0  # where the next round-robin plan starts looking


def scan(members: Iterable[tuple[str, ExitState]], rules: PairRules, now: float
         ) -> tuple[ExitState, PairState] | float:
    """The best ready exit, or the earliest time one could be (``UNTIL_RELEASE``:
    only a release or an answer can help).

    The best: the least loaded, then the pair that has waited longest (earliest token
    as paced now: a rate that moved since its last pace moves its token), then pool
    order. An exit more loaded than a ready one already found is passed over unjudged
    (a judgement paces the pair: most of an admission's cost on a small pool), and a
    full or dead one is settled without a judgement."""
    best: tuple[ExitState, PairState] | None = None
    best_key = (0.0, 0.0)
    earliest = UNTIL_RELEASE
    for exit_id, exit_state in members:
        load = settled(exit_state, now)
        if isinstance(load, tuple):  # DEAD until then, or FULL: only a release helps
            if load[0] is _DEAD:
                earliest = min(earliest, load[1])
            continue
        if best is not None and load > best_key[0]:
            continue  # more loaded than a ready exit already found: it cannot be chosen
        verdict, until, pair = judge_pair(exit_id, rules, now)
        if verdict is _READY:
            assert pair is not None
            key = (load, pair.bucket.tat)
            if best is None or key < best_key:
                best, best_key = (exit_state, pair), key
        elif verdict is _LATER:  # (DEAD was settled above)
            earliest = min(earliest, until)
    return earliest if best is None else best


class HeapSelector:
    """The large-pool search (see the module docstring); its state is per origin."""

    def __init__(self) -> None:
        self._pushed = itertools.count()  # a heap tie goes to the exit queued first

    def queue(self, search: Search, exit_id: str, when: float, now: float) -> None:
        """Queue an exit for when it could next be admitted (ready now: on the stack)."""
        if exit_id in search.queued:
            return
        search.queued.add(exit_id)
        if when <= now:
            search.ready.append(exit_id)
        else:
            heapq.heappush(search.heap, (when, next(self._pushed), exit_id))

    @staticmethod
    def reset(search: Search, pool: ExitPool) -> None:
        """Start over: every allowed exit ready, the first configured on top."""
        search.heap.clear()
        search.ready[:] = [e for e in reversed(pool.order) if pool.allows(e)]
        search.queued = set(search.ready)

    def select(self, search: Search, origin: str, pool: ExitPool, rules: PairRules,
               now: float) -> tuple[str, ExitState, PairState] | float:
        """The warmest ready exit (taken off the stack: ``queue`` it again once used),
        or the earliest time one could be."""
        heap, ready = search.heap, search.ready
        if not search.queued:  # first use: every exit ready, the first configured on top
            ready.extend(e for e in reversed(pool.order) if pool.allows(e))
            search.queued.update(ready)
        while heap and heap[0][0] <= now:
            ready.append(heapq.heappop(heap)[2])
        while ready:
            exit_id = ready.pop()
            search.queued.discard(exit_id)
            if not pool.allows(exit_id):  # back when the restriction is lifted
                continue
            exit_state = pool.states[exit_id]
            verdict, until, pair = judge(exit_id, exit_state, rules, now)
            if verdict is _READY:
                assert pair is not None
                return exit_id, exit_state, pair
            if verdict is _DEAD or verdict is _LATER:
                self.queue(search, exit_id, until, now)
                continue
            if verdict is _FULL:
                # this search has always made the pair of an exit it sets aside full
                # (the scan does not): kept, as it can make the exit the next scout
                rules.pair(exit_id)
            exit_state.waiting.add(origin)  # a release puts it back
        return heap[0][0] if heap else UNTIL_RELEASE


def round_robin(pool: ExitPool, search: Search) -> Iterator[tuple[str, ExitState]]:
    """The allowed exits, from where the last plan stopped, once round."""
    order, start = pool.order, search.plan_from
    for i in range(len(order)):
        index = (start + i) % len(order)
        search.plan_from = index + 1
        if pool.allows(order[index]):
            yield order[index], pool.states[order[index]]


def plan(members: Iterable[tuple[str, ExitState]], rules: PlanRules, now: float,
         limit: int | None, enough: float = math.inf) -> tuple[list[Candidate], float]:
    """Up to ``limit`` candidates, best first, looking no further once ``enough`` are
    found; and the earliest time an exit left out could come back."""
    ranked: list[tuple[tuple[float, float], Candidate]] = []
    earliest = UNTIL_RELEASE
    for exit_id, exit_state in members:
        verdict, until, pair = judge(exit_id, exit_state, rules, now, token=False)
        if verdict is _DEAD or verdict is _LATER:
            earliest = min(earliest, until)
            continue
        if verdict is not _READY:  # a release or an answer wakes the queue
            continue
        assert pair is not None
        bucket = pair.bucket
        ranked.append(((exit_state.in_flight / exit_state.limit, pair.last_admit),
                       Candidate(exit_id, bucket.interval, bucket.tolerance, exit_state.limit,
                                 rules.pair_key(exit_id))))
        if len(ranked) >= enough:
            break
    ranked.sort(key=lambda item: item[0])
    return [c for _, c in ranked[:limit]], earliest
