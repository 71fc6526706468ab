"""Parking lot for requests waiting to be admitted, driven by one timer on the running loop."""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import Any

from twisted.internet.defer import Deferred

from ._compat import call_later, is_asyncio_available
from .backends import Admission, Backend
from .core import Lease
from .core.scopes import Scope

logger = logging.getLogger(__name__)




class HandedBack(Exception):
    """A parked request was released without admission (spider closing)."""


class ExitsUnavailable(Exception):
    """No exit could serve the request's origin for EXITLIMIT_STALL_TIMEOUT (all banned/dead)."""


class Repin(Exception):
    """A sticky request's exit can no longer serve it: admit it anywhere and pin anew."""


#: a queue per origin, per (origin, exit) for requests pinned to an exit, and per the
#: named scopes its requests need (a scope's budget must not hold up other requests)
QueueKey = tuple[str, "str | None", "tuple[Scope, ...]"]


class Waiter:
    """A parked request: ``result`` fires with its lease (an asyncio future on the asyncio
    loop, a Deferred on other reactors: the cheapest thing to await on each)."""

    __slots__ = ("key", "parked_at", "result")

    def __init__(self, key: QueueKey, parked_at: float, result: asyncio.Future | Deferred):
        self.key = key
        self.parked_at = parked_at
        self.result = result

    @property
    def gone(self) -> bool:
        """Its request stopped waiting (cancelled): a lease must go to the next one."""
        result = self.result
        return result.done() if isinstance(result, asyncio.Future) else result.called

    def settle(self, lease: Lease) -> None:
        if isinstance(self.result, asyncio.Future):
            self.result.set_result(lease)
        else:
            self.result.callback(lease)

    def fail(self, exc: Exception) -> None:
        if self.gone:
            return
        if isinstance(self.result, asyncio.Future):
            self.result.set_exception(exc)
        else:
            self.result.errback(exc)


#: most leases one call to an asynchronous backend asks for
BATCH = 16


class AdmissionQueue:
    """FIFO per origin; one timer, armed for the earliest moment anything could be admitted.

    Requests pinned to an exit (sticky sessions) queue apart, per (origin, exit).
    Nothing polls: the timer is re-armed only when the earliest time changes,
    and a lease release wakes the queue at once (coalesced into one call).
    With an asynchronous backend (Redis) each queue has at most one admission
    call in flight, asking for as many leases as it has waiters (up to BATCH).
    """

    def __init__(self, backend: Backend,
                 on_admit: Callable[[Waiter | None, Lease, float], None]):
        self.backend = backend
        self.clock = backend.clock
        self.on_admit = on_admit
        self.queues: dict[QueueKey, deque[Waiter]] = {}
        self.parked = 0
        self._timer: Any = None
        self._timer_at = math.inf
        self._soon: Any = None
        self._pending: set[QueueKey] = set()  # queues with an admission call in flight
        self._ready_at: dict[QueueKey, float] = {}  # when its last call said to ask again
        #: queues a released lease would not help now (a release does not wake them)
        self._release_no_help: set[QueueKey] = set()
        #: queues woken while their call was in flight: its answer may predate the news
        self._stale_answer: set[QueueKey] = set()
        self.closed = False
        self._asyncio = is_asyncio_available()

    def origins(self) -> set[str]:
        return {key[0] for key in self.queues}

    def acquire(self, origin: str, pinned: str | None = None,
                scopes: tuple[Scope, ...] = ()) -> Lease | Awaitable[Lease]:
        """A lease now, or something to await for one: an asyncio future on the asyncio
        loop, else a Deferred (failing with HandedBack when handed back).

        ``pinned``: on this exit only (a sticky session's pin); ``scopes``: named budgets
        the request also needs, granted with the rest."""
        if self.closed:
            raise HandedBack
        now = self.clock()
        key = (origin, pinned, scopes)
        ready_at = math.inf
        if self.backend.synchronous and not self.queues.get(key):
            admission = self._admit(key, 1, now)
            assert isinstance(admission, Admission)
            if admission.leases:
                self.on_admit(None, admission.leases[0], now)
                return admission.leases[0]
            ready_at = admission.ready_at
        waiter = Waiter(key, now, self.waitable())
        self.queues.setdefault(key, deque()).append(waiter)
        self.parked += 1
        if self.backend.synchronous:
            # No second try: the one above has just failed, and a request queued behind
            # others of its queue goes after them, when the timer armed for them fires
            # or a release wakes the lot (a try per parked request, a scan of every exit,
            # was nearly half of a parking crawl's tries). A timer armed sooner stays.
            if ready_at < self._timer_at:
                self._arm(ready_at, now)
        else:  # requests parked in the same loop turn share one call
            self._wake_soon()
        return waiter.result

    def _admit(self, key: QueueKey, want: int, now: float) -> Any:
        origin, pinned, scopes = key
        if scopes:
            return self.backend.admit(origin, want, now, pinned, scopes=scopes)
        return self.backend.admit(origin, want, now, pinned)  # a Backend from before scopes

    def waitable(self) -> asyncio.Future | Deferred:
        """Something to await, fired by whoever holds it: an asyncio future on the asyncio
        loop (the cheapest there), else a Deferred."""
        return asyncio.get_running_loop().create_future() if self._asyncio else Deferred()

    def _wake_soon(self) -> None:
        """Look again on the next loop turn (once, however often asked this turn)."""
        if self._soon is None:
            self._soon = asyncio.get_running_loop().call_soon(self._wake_now) \
                if self._asyncio else call_later(0, self._wake_now)

    def wake(self) -> None:
        """State changed (a lease was released, a cooldown set): look again soon."""
        if not self.parked:
            return
        self._stale_answer.update(self._pending)
        for key in [k for k in self._ready_at if k not in self._release_no_help]:
            del self._ready_at[key]
        self._wake_soon()

    def changed(self, origins: Iterable[str]) -> None:
        """What the origins' admission rests on changed (a learned rate, a cooldown, a
        ban): look again at their queues, those a release would not help too. An
        asynchronous backend's answer named when a token is due at the pace it was
        told; a faster pace makes it due sooner (a learned rate up after the scout)."""
        if not self.parked:
            return
        origins = set(origins)
        for key in [k for k in self._ready_at if k[0] in origins]:
            del self._ready_at[key]
            self._release_no_help.discard(key)
        self.wake()

    def _wake_now(self) -> None:
        self._soon = None
        self._process()

    def _process(self) -> None:
        if not self.backend.synchronous:
            self._process_async()
            return
        now = self.clock()
        earliest = math.inf
        more = False
        # One lease per queue per turn of the event loop; a queue that got one comes back
        # on the next turn. Leases handed out together send their requests together, and
        # their answers then come back together, turn after turn: Scrapy handles them in
        # one loop turn, each starting CONCURRENT_ITEMS + 1 tasks, which outlive enough
        # collections to be promoted, and full collections come every 0.4 s (a learned
        # no-limit crawl, its exits in step since slow start: 26 of 50-80 ms each, 8 in
        # a bare crawl). Spread over turns, the answers come back one by one.
        for key in [k for k, q in self.queues.items() if q]:
            admission = self._admit(key, 1, now)
            assert isinstance(admission, Admission)
            if admission.leases:
                self._hand_out(key, admission.leases, now)
                more = more or bool(self.queues.get(key))
            else:
                earliest = min(earliest, admission.ready_at)
        if more:
            self._wake_soon()
        self._arm(earliest, now)

    def _hand_out(self, key: QueueKey, leases: list[Lease], now: float) -> None:
        queue = self.queues.get(key) or deque()
        for lease in leases:
            while queue and queue[0].gone:  # cancelled while parked
                queue.popleft()
                self.parked -= 1
            if not queue:  # its waiter left meanwhile (closing): the lease goes back
                self.backend.release(lease.id, answered=False)
                continue
            waiter = queue.popleft()
            self.parked -= 1
            self.on_admit(waiter, lease, now)
            waiter.settle(lease)
        if not queue:
            self.queues.pop(key, None)

    def _process_async(self) -> None:
        now = self.clock()
        for key, queue in list(self.queues.items()):
            if queue and key not in self._pending and self._ready_at.get(key, 0) <= now:
                self._pending.add(key)
                call = self._admit(key, min(len(queue), BATCH), now)
                if isinstance(call, Deferred):
                    call.addCallbacks(self._admitted, self._admit_errback, callbackArgs=(key,),
                                      errbackArgs=(key,))
                else:  # an asyncio future: no Deferred in between
                    call.add_done_callback(partial(self._admit_done, key))
        self._arm_async(now)

    def _admit_done(self, key: QueueKey, future: asyncio.Future) -> None:
        if future.cancelled():
            self._admit_failed("cancelled", key)
        elif future.exception() is not None:
            self._admit_failed(repr(future.exception()), key)
        else:
            self._admitted(future.result(), key)

    def _admit_errback(self, failure: Any, key: QueueKey) -> None:
        self._admit_failed(failure.getErrorMessage(), key)

    def _admitted(self, admission: Admission, key: QueueKey) -> None:
        self._pending.discard(key)
        now = self.clock()
        # closed meanwhile: no waiters, the leases go back
        self._hand_out(key, admission.leases, now)
        if self.closed:
            return
        stale = key in self._stale_answer
        self._stale_answer.discard(key)
        # a release during the call may have freed what the answer says is taken
        self._ready_at[key] = now if admission.leases or stale else admission.ready_at
        if admission.leases or admission.release_helps:
            self._release_no_help.discard(key)
        else:
            self._release_no_help.add(key)
        self._process_async()

    def _admit_failed(self, why: str, key: QueueKey) -> None:
        self._pending.discard(key)
        self._stale_answer.discard(key)
        logger.error("exitlimit: admission call failed for %s: %s", key[0], why)
        self._ready_at[key] = self.clock() + 0.1
        if not self.closed:
            self._arm_async(self.clock())

    def _arm_async(self, now: float) -> None:
        waits = [self._ready_at.get(k, now) for k, q in self.queues.items()
                 if q and k not in self._pending]
        for key in [k for k in self._ready_at if not self.queues.get(k)]:
            del self._ready_at[key]
            self._release_no_help.discard(key)
        self._arm(min(waits, default=math.inf), now)

    def _arm(self, when: float, now: float) -> None:
        if when == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = when
        if math.isfinite(when):
            self._timer = call_later(max(0.0, when - now), self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._timer_at = math.inf
        self._process()

    def fail(self, origin: str, exc: Exception, *, pinned_to: str | None = None) -> int:
        """Fail the requests parked for ``origin``: every one, or only those pinned to
        exit ``pinned_to``; returns how many."""
        failed = 0
        for key in [k for k in self.queues
                    if k[0] == origin and (pinned_to is None or k[1] == pinned_to)]:
            queue = self.queues.pop(key)
            self.parked -= len(queue)
            failed += len(queue)
            for waiter in queue:
                waiter.fail(exc)
        return failed

    def close(self) -> int:
        """Hand every parked request back; returns how many there were."""
        self.closed = True
        handed = 0
        for queue in self.queues.values():
            while queue:
                queue.popleft().fail(HandedBack())
                handed += 1
        self.queues.clear()
        self.parked = 0
        for timer in (self._timer, self._soon):
            if timer is not None:
                timer.cancel()
        self._timer = self._soon = None
        return handed
