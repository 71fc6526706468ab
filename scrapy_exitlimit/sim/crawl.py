"""A crawl as discrete events: the real :class:`Limiter` against model origins.

No sockets, no sleeping: time is a number this module advances. The crawl
feeds the limiter exactly what the middleware does (admission, then on each
answer the feedback call and the lease release; 429s and bans re-issued, never
lost) and models what Scrapy and the network add: ``CONCURRENT_REQUESTS``
(parked requests hold a slot), a client that does one thing at a time
(``cpu`` seconds per request, ``send`` of them before it leaves, so a request
admitted while the client is busy goes out late, the rest on its answer),
one-way latency with jitter on the way to the origin, dead proxies that refuse
connections. The middleware's CPU-load reading (``CpuLoad``, on each clean answer)
reads that client's work, so exits' in-flight limits shrink while it is saturated as
they do in a crawl, and the downloader is narrowed as the middleware narrows Scrapy's.
Deterministic for a given seed.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core import Lease, Limiter, Limits, Tuning, bounded_cooldown, make_exit
from ..core.health import BUSY_ROOM, CpuLoad, narrowed_total
from ..core.limits import CRAWL_TUNING
from ..core.warm import recall, remember
from .origins import OriginModel

#: the middleware's defaults (EXITLIMIT_COOLDOWN_MIN / _DEFAULT / _MAX)
COOLDOWN = {"floor": 0.5, "default": 2.0, "cap": 600.0}
#: the settings' defaults for the control laws (EXITLIMIT_SAFETY_MARGIN, _JITTER)
TUNING = CRAWL_TUNING


@dataclass
class Network:
    """One-way delays: to the origin ``base + U(0, jitter)``, back ``back``."""

    base: float = 0.001
    jitter: float = 0.0
    back: float = 0.001
    #: seconds the client spends on each request, one at a time (Scrapy is CPU-bound)
    cpu: float = 0.002
    #: ... of which before it leaves (the rest on its answer): sent behind the work
    #: queued before it, so requests admitted in a burst reach the server late
    send: float = 0.0001


@dataclass
class Crawl:
    """What to crawl: ``pages`` per origin, interleaved across origins."""

    origins: dict[str, OriginModel]
    pages: int
    exits: int = 10
    dead: int = 0  # the last ``dead`` exits refuse every connection
    rate: float | None = None  # EXITLIMIT_RATE; None: learned
    strategy: str = "exitlimit"  # or "bare": a random live exit, no limiter
    concurrency: int | None = None  # CONCURRENT_REQUESTS (the add-on's sizing)
    #: EXITLIMIT_BUSY_ROOM: while the client is CPU-bound, parked requests per queue
    #: beyond what is in flight (0: CONCURRENT_REQUESTS always)
    busy_room: int = BUSY_ROOM
    per_exit: int = 8
    network: Network = field(default_factory=Network)
    time_limit: float = 600.0
    seed: int = 1
    #: exit index of the first request's exit, to choose who scouts first
    first_exit: int = 0
    #: a warm start: what an earlier run learned (``Result.learned``), recalled first
    learned: dict[str, Any] | None = None
    #: control-law knobs over the crawl defaults (``core.limiter.Tuning`` fields, e.g.
    #: ``{"start_rate": 4.0}``): how a learner change is weighed before it is made
    tuning: dict[str, float] = field(default_factory=dict)


@dataclass
class Result:
    ok: int = 0
    lost: int = 0
    requests: int = 0
    status: dict[int, int] = field(default_factory=dict)
    wall: float = 0.0
    #: per origin: (time, status) of every answer, for plots and per-phase shares
    answers: list[tuple[float, str, int]] = field(default_factory=list)
    #: what the limiter learned, as a later run's ``Crawl.learned`` (times: the sim's)
    learned: dict[str, Any] = field(default_factory=dict)

    @property
    def share_429(self) -> float:
        return self.status.get(429, 0) / self.requests if self.requests else 0.0

    def share_429_after(self, t: float) -> float:
        after = [s for at, _, s in self.answers if at >= t]
        return after.count(429) / len(after) if after else 0.0


def exit_ip(index: int) -> str:
    return f"127.0.0.{10 + index}"


class _Sim:
    def __init__(self, crawl: Crawl) -> None:
        self.crawl = crawl
        self.now = 0.0
        self.rng = random.Random(crawl.seed)
        self.events: list[tuple[float, int, str, object]] = []
        self.seq = itertools.count()
        self.exits = [make_exit(f"http://{exit_ip(i)}:8000") for i in range(crawl.exits)]
        self.ip_of = {ex.id: exit_ip(i) for i, ex in enumerate(self.exits)}
        self.dead = {ex.id for ex in self.exits[crawl.exits - crawl.dead:]}
        order = self.exits[crawl.first_exit:] + self.exits[:crawl.first_exit]
        self.limiter = Limiter(order, Limits(rate=crawl.rate, concurrency=crawl.per_exit),
                               clock=lambda: self.now, tuning=Tuning(**{**TUNING, **crawl.tuning}),
                               rng=random.Random(crawl.seed))
        names = list(crawl.origins)
        # interleaved: page 0 of every origin, then page 1 of every origin...
        self.todo: deque[str] = deque(n for _ in range(crawl.pages) for n in names)
        self.total = len(self.todo)
        self.configured_slots = crawl.concurrency or \
            crawl.exits * crawl.per_exit + max(16, crawl.exits)
        self.slots = self.configured_slots  # narrowed while the client is CPU-bound
        self.active = 0
        self.queues: dict[str, deque[int]] = {n: deque() for n in names}
        self.timer_at = math.inf
        self.cpu_free = 0.0
        self.cpu_work = 0.0  # the client's work taken on so far, done or queued
        self.cpu_load = CpuLoad()
        self.result = Result()
        self.last_outcome = 0.0

    # -- event plumbing --------------------------------------------------------
    def at(self, when: float, kind: str, data: object = None) -> None:
        heapq.heappush(self.events, (when, next(self.seq), kind, data))

    def run(self) -> Result:
        if self.crawl.learned:
            recall(self.limiter, self.crawl.learned, wall_now=0.0, max_age=math.inf)
        self.feed()
        while self.events and self.result.ok < self.total:
            when, _, kind, data = heapq.heappop(self.events)
            if when > self.crawl.time_limit:
                break
            self.now = max(self.now, when)
            getattr(self, "on_" + kind)(data)
        self.result.lost = self.total - self.result.ok
        self.result.wall = self.last_outcome
        self.result.learned = remember(self.limiter, offset=0.0)
        return self.result

    # -- the downloader: slots, parking, admission ------------------------------
    def feed(self) -> None:
        while self.active < self.slots and self.todo:
            origin = self.todo.popleft()
            self.active += 1
            self.queues[origin].append(0)
        self.admit()

    def admit(self) -> None:
        if self.crawl.strategy == "bare":
            for origin, queue in self.queues.items():
                while queue:
                    queue.popleft()
                    live = [e for e in self.exits if e.id not in self.dead] or self.exits
                    self.send(origin, self.rng.choice(live).id, None)
            return
        earliest = math.inf
        active = [o for o, q in self.queues.items() if q]
        while active:  # round robin over origins, as the admission queue does
            still = []
            for origin in active:
                got = self.limiter.try_admit(origin, self.now)
                if isinstance(got, Lease):
                    self.queues[origin].popleft()
                    self.send(origin, got.exit_id, got)
                    if self.queues[origin]:
                        still.append(origin)
                else:
                    earliest = min(earliest, got)
            active = still
        if math.isfinite(earliest) and earliest < self.timer_at:
            self.timer_at = earliest
            self.at(earliest, "timer")

    def on_timer(self, _: object) -> None:
        if self.now >= self.timer_at:
            self.timer_at = math.inf
        self.admit()

    def send(self, origin: str, exit_id: str, lease: Lease | None) -> None:
        self.result.requests += exit_id not in self.dead
        if exit_id in self.dead:  # connection refused, at once
            self.at(self.now + 0.001, "refused", (origin, exit_id, lease))
            return
        net = self.crawl.network
        leaves = max(self.now, self.cpu_free) + net.send  # one thing at a time
        self.cpu_free = leaves
        self.cpu_work += net.send
        arrive = leaves + net.base + self.rng.uniform(0.0, net.jitter)
        self.at(arrive, "arrive", (origin, exit_id, lease))

    def on_arrive(self, data: tuple[str, str, Lease | None]) -> None:
        origin, exit_id, lease = data
        model = self.crawl.origins[origin]
        status = model.arrive(self.ip_of[exit_id], self.now)
        self.result.status[status] = self.result.status.get(status, 0) + 1
        self.result.answers.append((self.now, origin, status))
        self.at(self.now + self.crawl.network.back, "answer", (origin, exit_id, lease, status))

    def on_answer(self, data: tuple[str, str, Lease | None, int]) -> None:
        # the client handles answers one at a time: this one when the last is done
        start = max(self.now, self.cpu_free)
        self.cpu_free = start + self.crawl.network.cpu - self.crawl.network.send
        self.cpu_work += self.crawl.network.cpu - self.crawl.network.send
        self.at(self.cpu_free, "handled", data)

    def on_handled(self, data: tuple[str, str, Lease | None, int]) -> None:
        origin, exit_id, lease, status = data
        if lease is not None:
            lim = self.limiter
            if status == 200:
                if self.cpu_load.due(self.now):  # as the middleware reads it
                    busy = self.cpu_load.sample(self.now, self.cpu_seconds())
                    lim.cpu_bound(busy)
                    self.narrow(busy)
                lim.success(lease, self.now - lease.admitted_at)
            elif status == 429:
                retry = self.crawl.origins[origin].retry_after
                lim.rate_limited(origin, exit_id, bounded_cooldown(retry, **COOLDOWN), lease)
            elif status == 403:
                lim.banned(lease)
            lim.release(lease.id, answered=True)
        self.done(origin, status == 200)

    def narrow(self, busy: bool) -> None:
        """The downloader held to what is in flight and the room while busy, as the
        middleware holds Scrapy's (``room.py``)."""
        if not self.crawl.busy_room:
            return
        waiting = [len(q) for q in self.queues.values() if q]
        self.slots = narrowed_total(self.configured_slots, busy, self.active, sum(waiting),
                                    self.crawl.busy_room, len(waiting))

    def cpu_seconds(self) -> float:
        """The client's CPU time so far: its work queued back to back up to ``cpu_free``,
        less what is still to run."""
        return self.cpu_work - max(0.0, self.cpu_free - self.now)

    def on_refused(self, data: tuple[str, str, Lease | None]) -> None:
        origin, exit_id, lease = data
        if lease is not None:
            self.limiter.release(lease.id, answered=False)
            self.limiter.proxy_fault(None, exit_id, origin)
        self.done(origin, False)

    def done(self, origin: str, ok: bool) -> None:
        self.active -= 1
        if ok:
            self.result.ok += 1
            self.last_outcome = self.now
        else:  # re-issued: back to the front of the scheduler (Scrapy's LIFO default)
            self.todo.appendleft(origin)
        self.feed()


def simulate(crawl: Crawl) -> Result:
    return _Sim(crawl).run()


def origin_names(count: int) -> Sequence[str]:
    return [f"http://site{i}.test" for i in range(count)]
