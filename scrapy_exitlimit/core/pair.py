"""One (origin, exit) pair: where the server's per-IP limit lives, and its law.

The rate a pair paces at is the learner's to say (``learner.py``); the pair
keeps the rest:

1. **Pacing.** A GCRA bucket at the pair's rate. A new pace starts one new
   interval after the pair's last request (when slower: after it reached the
   server, as far as rule 2 bounds that), not an old interval later when faster
   (a probe starts at once).
2. **Arrivals.** The server counts arrivals, we count admissions: a request
   answered ``latency`` after admission reached the server no later than
   ``now - min_latency``, so the next one goes an interval after that. Until
   ``WARM_ANSWERS`` answers show what "fast" is for the path, assume the worst
   (it arrived as the answer came). ``spread``, the 90th percentile of how much
   later than the fastest answers come, is how close together requests paced
   evenly may reach the server. Near a known limit on a jittery path the next
   request waits for the previous answer (``answer_wait`` past its interval at
   most), so its arrival re-anchors pacing first. Once ``SETTLED_ANSWERS``
   answers have measured the path, a given rate's safety margin shrinks to its
   settled share (``Limiter.safety_margin``).
3. **Cooldown.** A 429 cools the pair down for its Retry-After (never
   shortened by a later, shorter one); the bucket is held so the cooldown ends
   with one request, not a burst. A 429 to a request sent after the previous
   cooldown ended says that cooldown was too short: from the second such 429 in a
   row the Retry-After doubles each time.
4. **Breaker.** ``breaker_after`` such 429s in a row with no success, or one on
   a half-open pair, open the breaker: at least ``breaker_cooldown`` doubled on
   each re-open (at most an hour), then one probe.
5. **Ban.** A 403 / block page bans the pair (not the exit everywhere) for
   ``ban_cooldown`` doubled on each ban (at most a day), then one probe.
6. **Single file.** A new pair (no answer yet: its first request may ride a
   cold connection and arrive late) or a half-open one sends one request at a
   time. A success closes the breaker and forgets the bans.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from .bucket import WARM_ANSWERS, TokenBucket
from .learner import PairLearning
from .learning import RateEstimate

#: how fast ``PairState.min_latency`` forgets a fast sample (the path may get slower)
LATENCY_FORGET = 0.02
#: latency samples the arrival spread of a pair is read from (its 90th percentile)
SPREAD_SAMPLES = 16
#: the share of the arrival spread added to a pair's interval near a known limit
SPREAD_MARGIN = 0.2
#: answers after which a pair's path is settled: its fastest answer, read off a full
#: spread sample, bounds when its requests arrived well enough that a pair paced at a
#: given rate keeps of the safety margin only what its spread needs, and SETTLED_MARGIN
#: of it at least (the server's clock: nginx counts whole milliseconds). Before that
#: the floor may be read too high and the next request sent too close: through
#: tinyproxy to nginx at a flat 2 ms margin, the 429s came on a pair's 5th to 8th
#: request, none after the first 1.5 s
SETTLED_ANSWERS = SPREAD_SAMPLES
SETTLED_MARGIN = 0.4
#: the longest an open breaker holds, and the longest ban (seconds)
BREAKER_MAX = 3600.0
BAN_MAX = 86400.0


@dataclass
class PairState:
    """(origin, exit): where the server's per-IP limit lives."""

    bucket: TokenBucket
    #: what the answers taught about this pair's limit (its own rate, trust, probes)
    learning: PairLearning = field(default_factory=PairLearning)
    cooldown_until: float = -math.inf
    streak_429: int = 0
    in_flight: int = 0
    #: no answer seen yet: the first request may sit behind a cold connection and
    #: reach the server late, so the second one would land too close behind it
    proven: bool = False
    #: the fastest admission-to-answer time seen lately (drifts up slowly)
    min_latency: float = math.inf
    answers: int = 0
    #: how much later than the fastest an answer comes (recent samples), and their 90th
    #: percentile: how far apart in time requests paced evenly may reach the server
    lateness: deque[float] = field(default_factory=lambda: deque(maxlen=SPREAD_SAMPLES))
    spread: float = 0.0
    #: near a known limit on a jittery path: the next request waits for the answer to
    #: the previous one (its arrival then re-anchors pacing), at most this long past
    #: its interval
    answer_wait: float = 0.0
    #: how far the latest answer pushed the next token on (re-anchoring on its arrival):
    #: time the pacing spent on the path, not on the rate
    anchored: float = 0.0
    #: 429s in a row to requests sent after the previous cooldown had ended (what the
    #: breaker counts, and what lengthens a Retry-After that keeps proving too short)
    tested_429: int = 0
    breaker_opened: int = 0  # times the breaker opened without a success since
    half_open: bool = False
    banned_until: float = -math.inf
    bans: int = 0
    last_admit: float = -math.inf
    last_success: float = -math.inf
    #: the latest answer while the path was cold (no arrival slack known): its request
    #: reached the server as late as that, so a slower pace counts from here too
    arrived_by: float = -math.inf

    @property
    def own_limit(self) -> RateEstimate | None:
        """The pair's own limit (configured, announced, or learned as slower than the
        pool); None: it paces at the pool's rate."""
        return self.learning.own

    @own_limit.setter
    def own_limit(self, value: RateEstimate | None) -> None:
        self.learning.own = value

    @property
    def single_file(self) -> bool:
        """One request at a time: a new pair, or a half-open breaker or ban."""
        return (not self.proven or self.half_open) and self.in_flight > 0

    @property
    def held_until(self) -> float:
        """When its cooldown and ban are both over."""
        return max(self.cooldown_until, self.banned_until)

    def answer_gate(self) -> float:
        """Until when the pair waits for its previous answer (-inf: it does not)."""
        if self.answer_wait and self.in_flight:
            return self.last_admit + self.bucket.interval + self.answer_wait
        return -math.inf

    def ready_at(self, now: float) -> float:
        return max(self.bucket.ready_at(now), self.cooldown_until, self.banned_until,
                   self.answer_gate())

    def usable(self, now: float) -> bool:
        """Not banned, breaker not open: it could serve (perhaps after its token)."""
        return not (self.banned_until > now or self.breaker_opened and self.cooldown_until > now)

    @property
    def settled(self) -> bool:
        """Enough answers that the path's floor is measured (rule 2's margin shrinks)."""
        return self.answers >= SETTLED_ANSWERS

    @property
    def arrival_slack(self) -> float:
        """How long before its answer a request surely reached the server (0 until warm)."""
        return self.min_latency if self.answers > WARM_ANSWERS else 0.0

    # -- the law -------------------------------------------------------------
    def pace(self, rate: float, margin: float) -> None:
        """Pace at ``rate`` with ``margin`` added to each interval (rule 1)."""
        bucket = self.bucket
        if rate != bucket.rate or margin != bucket.margin:
            before = bucket.interval
            bucket.set_rate(rate, margin=margin)
            # the next request one new interval after the last: not sooner when slower,
            # not an old interval later when faster (a probe starts at once)
            if bucket.interval > before:
                # from the last admission, or from as late as a cold path's last answer
                # (a first request on a cold connection reaches the server well after
                # its admission: rule 2's worst case)
                bucket.arrived(max(self.last_admit, self.arrived_by))
            elif math.isfinite(bucket.tat):
                bucket.tat -= before - bucket.interval

    def admitted(self, now: float) -> None:
        self.last_admit = now
        self.in_flight += 1

    def answered(self, now: float, latency: float) -> None:
        """An answer came ``latency`` after admission: re-anchor the pacing (rule 2)."""
        self.proven = True
        self.answers += 1
        if self.answers == 1:
            self.min_latency = latency
        else:
            drift = self.min_latency + LATENCY_FORGET * (latency - self.min_latency)
            self.min_latency = min(latency, drift)
        self.lateness.append(latency - self.min_latency)
        if len(self.lateness) >= WARM_ANSWERS:
            late = sorted(self.lateness)
            self.spread = late[int(0.9 * (len(late) - 1))]
        before = self.bucket.tat
        slack = self.arrival_slack
        if not slack:
            self.arrived_by = max(self.arrived_by, now)
        self.bucket.arrived(now - slack)
        self.anchored = self.bucket.tat - before if math.isfinite(before) else 0.0

    def rate_limited(self, now: float, retry_after: float, *, admitted_at: float | None,
                     stretch: float, breaker_after: int, breaker_cooldown: float
                     ) -> float | None:
        """A 429 to a request admitted at ``admitted_at`` (None: not known): cool down
        for ``retry_after`` times ``stretch`` (the jitter) at least (rules 3, 4). Returns
        when the breaker this opened closes, or None when it did not open."""
        self.streak_429 += 1
        # a 429 to a request sent after the last cooldown ended says that cooldown was
        # too short; one sent before it (in flight with the first) is the same event
        if admitted_at is None or admitted_at >= self.cooldown_until:
            self.tested_429 += 1
        # a Retry-After that keeps proving too short (a window limit answering "1" until
        # its window ends) doubles from the second such 429 in a row, before any breaker
        wait = retry_after
        if admitted_at is not None:
            wait *= 2 ** max(0, self.tested_429 - 1)
        until = now + wait * stretch
        opened = None
        if self.half_open or self.tested_429 >= breaker_after:
            self.breaker_opened += 1
            self.half_open = True
            hold = breaker_cooldown * 2 ** (self.breaker_opened - 1)
            until = opened = max(until, now + min(hold, BREAKER_MAX))
        self.cooldown_until = max(self.cooldown_until, until)
        self.bucket.hold_until(self.cooldown_until)
        return opened

    def hold(self, until: float) -> bool:
        """No request before ``until`` (a quota the server says is used up); whether
        that is later than the cooldown already set."""
        if until <= self.cooldown_until:
            return False
        self.cooldown_until = until
        self.bucket.hold_until(until)
        return True

    def banned(self, now: float, ban_cooldown: float) -> None:
        """A 403 / block page (rule 5): after the ban, one probe first."""
        self.bans += 1
        hold = ban_cooldown * 2 ** (self.bans - 1)
        self.banned_until = max(self.banned_until, now + min(hold, BAN_MAX))
        self.half_open = True

    def succeeded(self, now: float) -> bool:
        """A clean answer (rule 6); whether it was a half-open pair's probe."""
        self.streak_429 = self.tested_429 = 0
        self.last_success = now
        probe = self.half_open
        if self.half_open or self.breaker_opened or self.bans:
            self.half_open = False
            self.breaker_opened = 0
            self.bans = 0
        return probe
