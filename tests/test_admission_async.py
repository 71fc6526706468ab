"""The parking lot: no wake-up may be lost (an asynchronous backend), no try wasted."""

from __future__ import annotations

import asyncio
import math

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater

from scrapy_exitlimit.admission import AdmissionQueue
from scrapy_exitlimit.backends import Admission
from scrapy_exitlimit.core import Lease


class ManualBackend:
    """Admission calls that answer only when the test says so."""

    synchronous = False

    def __init__(self) -> None:
        self.calls: list[Deferred] = []
        self.released: list[int] = []

    def clock(self) -> float:
        return 1000.0

    def admit(self, origin, want, now, pinned=None) -> Deferred:
        d = Deferred()
        self.calls.append(d)
        return d

    def release(self, lease_id, answered=True):
        self.released.append(lease_id)


def lease(n: int) -> Lease:
    return Lease(n, "http://o", "e", 1000.0, 1.0, 1.0, False)


async def turn() -> None:
    await deferLater(reactor, 0.01, lambda: None)


def fired(waiting: asyncio.Future | Deferred) -> bool:
    """Whether a parked request got its lease (or failed)."""
    return waiting.done() if isinstance(waiting, asyncio.Future) else waiting.called


@pytest_twisted.ensureDeferred
async def test_a_release_during_an_admission_call_is_not_lost():
    backend = ManualBackend()
    queue = AdmissionQueue(backend, lambda *a: None)
    waiting = queue.acquire("http://o")
    await turn()
    assert len(backend.calls) == 1  # the call is in flight
    queue.wake()  # a lease is released meanwhile
    await turn()
    assert len(backend.calls) == 1  # one call at a time per queue
    # the answer was computed before the release: nothing free, only a release can help
    backend.calls[0].callback(Admission([], math.inf))
    await turn()
    assert len(backend.calls) == 2  # asked again at once, not parked forever
    backend.calls[1].callback(Admission([lease(7)], 1000.0))
    assert (await waiting).id == 7


@pytest_twisted.ensureDeferred
async def test_an_answer_that_needs_no_release_waits_for_its_time_only():
    backend = ManualBackend()
    queue = AdmissionQueue(backend, lambda *a: None)
    queue.acquire("http://o")
    await turn()
    backend.calls[0].callback(Admission([], math.inf))  # only a release can help
    await turn()
    assert len(backend.calls) == 1
    queue.wake()
    await turn()
    assert len(backend.calls) == 2
    queue.close()
    backend.calls[1].callback(Admission([lease(3)], 1000.0))
    assert backend.released == [3]  # closed meanwhile: the lease goes back


class CountingBackend:
    """A synchronous backend (the memory one's shape) that admits only when told to."""

    synchronous = True

    def __init__(self) -> None:
        self.tries = 0
        self.free: list[Lease] = []

    def clock(self) -> float:
        return 1000.0

    def admit(self, origin, want, now, pinned=None) -> Admission:
        self.tries += 1
        if self.free:
            return Admission([self.free.pop(0)], now)
        return Admission([], math.inf)  # nothing free: only a release can help


@pytest_twisted.ensureDeferred
async def test_a_request_parked_behind_others_costs_no_admission_try():
    backend = CountingBackend()
    queue = AdmissionQueue(backend, lambda *a: None)
    waiting = [queue.acquire("http://o") for _ in range(5)]
    # one try, the first request's: the others queue behind it, as they must (FIFO)
    assert backend.tries == 1
    assert queue.parked == 5
    backend.free = [lease(1), lease(2)]
    queue.wake()  # a release
    await turn()
    assert [fired(w) for w in waiting] == [True, True, False, False, False]
    assert (await waiting[0]).id == 1
    assert backend.tries == 4  # two leases, then the try that found nothing more
    queue.close()


@pytest_twisted.ensureDeferred
async def test_leases_free_at_once_go_out_one_per_queue_per_loop_turn():
    # handed out together, requests go out together and their answers come back together,
    # turn after turn (a learned crawl's exits in step since slow start); one per turn
    # lets them drift apart
    backend = CountingBackend()
    queue = AdmissionQueue(backend, lambda *a: None)
    waiting = {o: [queue.acquire(o) for _ in range(2)] for o in ("http://a", "http://b")}
    backend.free = [lease(n) for n in range(1, 5)]

    def settled() -> dict[str, int]:
        return {o: sum(fired(w) for w in ws)
                for o, ws in waiting.items()}

    queue._process()  # one turn
    assert settled() == {"http://a": 1, "http://b": 1}
    assert queue._soon is not None  # the rest on the next turn, not on a release
    await turn()
    assert settled() == {"http://a": 2, "http://b": 2}
    assert queue.parked == 0
    queue.close()


@pytest_twisted.ensureDeferred
async def test_a_change_to_an_origins_pacing_asks_again_before_the_time_named():
    """An asynchronous backend named when a token is due at the pace it was told; a
    learned rate up makes it due sooner: the origin's queue asks again at once, though
    a release would not have helped it (another origin's queue keeps its time)."""
    backend = ManualBackend()
    queue = AdmissionQueue(backend, lambda *a: None)
    queue.acquire("http://o")
    queue.acquire("http://other")
    await turn()
    assert len(backend.calls) == 2
    for call in backend.calls:  # a token due in 0.5 s (2 r/s); a release would not help
        call.callback(Admission([], 1000.5, False))
    await turn()
    queue.wake()  # a release: no new call
    await turn()
    assert len(backend.calls) == 2
    queue.changed({"http://o"})  # the origin's pairs now paced at 4 r/s
    await turn()
    assert len(backend.calls) == 3  # asked again, for that origin only
    queue.close()
