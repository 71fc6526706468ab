"""One origin's learned limits: which key a 429 points at, and how fast each key may go.

A server limits a key: the client IP (the (origin, exit) pair) or the site as a
whole. The learner reads which from the answers, then learns that key's rate
with a :class:`RateEstimate`:

1. **Discovery.** The start rate is a guess. One scout exit proves it; the
   other exits send one request each and wait for the verdict, so a start rate
   above the limit draws one 429, not one per exit. Meanwhile one more exit (the
   ``leap``) tries twice the start rate: clean, slow start goes on from there a
   step sooner; a 429 is the lone 429 that a second exit must confirm anyway. On a
   fast path with the crawl mostly on this origin the first leap is the far one
   (eight or four times the start rate, as fast as the answers before its test
   came); refused, another exit leaps twice it.
2. **The pool's per-IP rate** (``pool``): one scout at a time probes above what
   is clean (slow start, then bisection); the others pace at ``lo``.
3. **A lone exit is not the pool.** Before any ceiling is known, a scout's 429
   is first that exit's own limit; it becomes the pool's once a second exit
   hits it too. An exit that 429s at a pace it never ran clean is slower than
   the pool: it learns its own rate (``PairLearning.own``) and drags no one.
4. **The site.** A 429 at a pace the pair has run clean before (or on its
   first request) is not the pair's limit. When such 429s come from two or more
   exits within ``SITE_WINDOW`` (three, where they are only later than the pool's
   pace: a pair with no spacing of its own yet may be a slow exit), the origin is
   limited as a whole: the ``site`` estimate starts at the rate the origin
   actually accepted, the origin's budget paces requests across exits by it, and
   the pairs keep their rates.
5. **Limits move.** Ceilings drift up while clean (RateEstimate); both scopes
   re-probe, so a raised limit is found and a tightened one is met by 429s.

One decrease per congestion event, per scope: 429s to requests admitted
before the estimate last changed teach nothing more.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .events import Event
from .learning import BACKOFF_BY_STREAK, CLIMB_BELOW, GROWTH, RESOLUTION, RateEstimate, backoff

#: an exit slower than the pool learns its own limit to within 2 x 10 %, and its ceiling
#: drifts at 0.2 %/s: it carries little of the crawl, and each probe of its limit costs
#: a 429 (lab, mixed pool: five per slow exit to bisect 1 r/s to 2 %, then re-probe it)
SLOW_RESOLUTION = 0.1
SLOW_DRIFT = 0.002
#: clean answers at a probed rate, with the pair really pacing, that confirm it:
#: one in slow start (far from any ceiling), more when bisecting near one
CONFIRMATIONS = 1
CONFIRMATIONS_NEAR_CEILING = 3
#: seconds an admission may come after its token's time and still prove a start rate
ADMIT_LATE = 0.005
#: ... allowed for once it is this share of the pacing interval or more (under it, the
#: 10 % a confirmation allows absorbs it, and probes at a few r/s stay exact)
LATE_SHARE = 0.1
#: a 429 this much closer after the last clean request than any clean one came is the
#: pair's own limit; between that and as late as a clean one, the site's
CLEARLY_CLOSER = 0.9
#: clean gaps a pair remembers (for RECENT seconds): a 429 at a wider gap than one
#: of them cannot be the pair's own limit
CLEAN_GAPS = 8
RECENT = 3.0
#: the site is blamed when 429s its pairs' spacing does not explain come from two exits
#: this close (or within two of the pool's intervals, whichever is longer)
SITE_WINDOW = 0.5
#: that many of the exits in use (at least two) 429ing at the pool's pace: its rate is wrong
POOL_SHARE = 0.3
#: 429s as late as clean ones (the site's, or jitter at a pair's limit) point at the site
#: when they come from this many exits within the window
AMBIGUOUS_EXITS = 3
#: the pool's pace drawing 429s on this many exits at once (or more) halves it
HALVE_EXITS = 3
#: an exit alone that 429s twice within this many seconds is slower than the pool
STRIKE_WINDOW = 3.0
#: ... at once, when it set the pool's ceiling and the pool runs clean this much faster
OUTPACED = 1.2
#: 429s that may be jitter at the pool's per-IP limit point at the site only while at
#: least this share of the last second's answers are 429s (``_pool_jitter``)
SITE_REFUSED = 0.3
#: clean answers with the origin budget really pacing that confirm a site rate
SITE_CONFIRMATIONS = 4
#: a scout that has not settled its probe in this many intervals hands it on
SCOUT_PATIENCE = 20
#: an exit that drew a 429 within this many seconds does not scout for the pool
SCOUT_QUIET = 5.0
#: answers since the site's rate last changed that tell what share it takes
MIN_SHARE_ANSWERS = 5
#: a pool decrease still this many times over what the site took per exit over the last
#: SITE_MEMORY seconds goes straight down to that
STORM_OVER = 4.0
#: seconds of clean answers a site decrease never goes under (as a rate): a limit
#: counted over a window (N per minute) goes on refusing for the rest of its window
#: whatever the pace, and must not walk the site rate to the floor
SITE_MEMORY = 10.0
#: the far leap needs the answer that picks it within this share of its interval (a
#: quarter: its test can then arrive at most 1.25 intervals after the request before it)
FAR_LEAP_LATENCY = 4.0
#: after a clean far leap, slow start's next step tries up to this many times the rate it
#: proved, where the path is fast enough to test it (``OriginLearner.jump``)
JUMP = 8.0
#: a jump is done once a step runs at this share of it or more; a step the event loop
#: sent later (a full garbage collection held the lab's crawl 30 ms just then in most
#: runs) proves only the slower pace, and the jump stays the next step's floor
JUMP_RAN = 0.9
#: seconds after a 429 in slow start that the pool's exits send one request at a time
WARY = 1.0


@dataclass
class PairLearning:
    """What the answers taught about one pair."""

    #: the pair's own limit: configured, announced, or learned because it proved
    #: slower than the pool
    own: RateEstimate | None = None
    confirmations: int = 0
    confirmed_rate: float = math.inf  # the lowest achieved rate in the current streak
    #: 429s since the last paced success (a success right after a cooldown proves
    #: nothing about the rate): how hard the next decrease is
    rate_streak: int = 0
    #: when the pair's latest clean request was admitted: a per-IP limit counts the
    #: spacing from the last request it accepted, so that is the gap that matters
    last_clean: float = -math.inf
    #: a shared backend: the latest admission on the pair another process made (its
    #: answer unknown here). Seeing every third request of a pair, a process would
    #: judge a 429 at the pair's pace as surely later than any clean one, the site's
    last_foreign: float = -math.inf
    #: recent (time, gap since the previous clean request) of clean answers
    clean_gaps: deque[tuple[float, float]] = field(
        default_factory=lambda: deque(maxlen=CLEAN_GAPS))
    strike: float = -math.inf  # its last 429 that pointed at no one else
    last_429: float = -math.inf  # its last 429 of any kind: a scout is one quiet lately
    #: the rate the server's headers state for this pair, and one a 429 contradicted
    #: (ignored until the headers say something else)
    announced: float | None = None
    distrusted: float | None = None
    distrusted_at: float = -math.inf  # when a 429 contradicted the statement


class PoolPacing(NamedTuple):
    """What an exit search reads from an origin's learner once, not once per exit (its
    judgements were two thirds of a no-limit crawl's calls into the limiter)."""

    #: ``pair_rate``, ``near_limit`` and ``given_limit`` of every pair with no limit of
    #: its own whose exit is neither the scout nor the leap (``special``): the pool's
    rate: float
    near: bool
    given: bool
    special: tuple[str | None, str | None]
    #: whether discovery may hold an exit at all (False: ``holds`` is False for every one)
    holding: bool


@dataclass(kw_only=True)
class SharedRateLearner:
    """The rate of a key every exit shares, learned from 429s that follow it across
    exits: the origin as a whole (the site rate, rule 4) or a named scope (an account,
    an API key). Holds the traffic it is judged by (admissions and answers over the
    last seconds) and the ``site`` estimate once 429s point at the key."""

    min_rate: float
    max_rate: float
    #: what the events say: ``site`` (site_limited, site_rate_up, ...) or ``scope``
    kind: str = "site"
    #: the key's rate once 429s point at it as a whole (or a configured one)
    site: RateEstimate | None = None
    #: a configured rate: the learned one never goes above it
    site_ceiling: float | None = None
    #: recent 429s that may point at the key: (time, exit, surely)
    site_blame: deque[tuple[float, str, bool]] = field(default_factory=deque)
    #: answers over the last two seconds: (time, admitted at, clean)
    answers: deque[tuple[float, float, bool]] = field(default_factory=deque)
    #: when clean answers came, over the last SITE_MEMORY seconds
    clean_times: deque[float] = field(default_factory=deque)
    #: admissions over the last two seconds: (time, exit), the key's actual rate
    admissions: deque[tuple[float, str]] = field(default_factory=deque)
    first_admission: float = math.inf
    site_confirmations: int = 0
    site_gaps: float = 0.0  # the summed gaps of those confirmations
    site_decreased: float = -math.inf
    site_streak: int = 0  # decreases, each within a second of the last

    def site_rate(self) -> float | None:
        if self.site is None:
            return self.site_ceiling
        return self.site.target()

    def admitted_rate(self, now: float, window: float = 1.0, least: float = 0.1) -> float:
        """Requests/s admitted for the origin over the ``window`` seconds up to ``now``
        (over less when its first admission is more recent, but at least ``least`` s).
        Admissions after ``now`` (a time in the past) are not counted."""
        return self._per_second(self.admitted_count(now, window), now, window, least)

    def admitted_count(self, now: float, window: float) -> int:
        """Admissions for the key over the ``window`` seconds up to ``now`` (at most 2)."""
        return sum(1 for at, _ in self.admissions if 0 <= now - at <= window)

    def offered_pace(self, now: float) -> float:
        """``admitted_rate`` over the last second less each exit's first request while
        the crawl is young (the admissions kept still reach back to its start):
        discovery sends those together, one per exit, a burst and not a pace."""
        count = self.admitted_count(now, 1.0)
        if now - self.first_admission <= 2.0:
            firsts: dict[str, float] = {}
            for at, exit_id in self.admissions:
                firsts.setdefault(exit_id, at)
            count -= sum(1 for at in firsts.values() if 0 <= now - at <= 1.0)
        return self._per_second(count, now, 1.0, 0.1)

    def rate_before(self, admitted_at: float) -> float:
        """Requests/s admitted over the second up to ``admitted_at`` (a request's
        admission): what the origin saw as that request arrived, however late its answer
        is read. When later admissions have pushed that second out of the two kept, the
        oldest second still kept."""
        if self.admissions:
            admitted_at = max(admitted_at, self.admissions[-1][0] - 1.0)
        return self.admitted_rate(admitted_at)

    def accepted_rate(self, now: float, window: float = 1.0, least: float = 0.1) -> float:
        """Clean answers/s over the last ``window`` seconds: what the site takes."""
        return self._per_second(sum(1 for at, _, ok in self.answers if ok and now - at <= window),
                                now, window, least)

    def refused_share(self, now: float) -> float | None:
        """The share of the last second's answers that were 429s (None: fewer than
        MIN_SHARE_ANSWERS, too few to tell)."""
        recent = [ok for at, _, ok in self.answers if now - at <= 1.0]
        return 1.0 - sum(recent) / len(recent) if len(recent) >= MIN_SHARE_ANSWERS else None

    def clean_share(self, since: float) -> float | None:
        """The share of clean answers to requests admitted since ``since`` (None: too
        few answers to tell)."""
        recent = [ok for _, admitted, ok in self.answers if admitted >= since]
        return sum(recent) / len(recent) if len(recent) >= MIN_SHARE_ANSWERS else None

    def _clean_rate(self, now: float, window: float) -> float:
        """Clean answers/s over the last ``window`` (at most SITE_MEMORY) seconds."""
        return self._per_second(sum(1 for at in self.clean_times if now - at <= window),
                                now, window, 1.0)

    def _per_second(self, count: int, now: float, window: float, least: float) -> float:
        span = window if self.first_admission <= now - window else now - self.first_admission
        return count / max(span, least)

    def active_exits(self, now: float) -> int:
        """Exits admitted for the origin over the last two seconds."""
        return len({exit_id for _, exit_id in self.admissions})

    def _answered(self, now: float, admitted_at: float, clean: bool) -> None:
        answers = self.answers
        answers.append((now, admitted_at, clean))
        while now - answers[0][0] > 2.0:
            answers.popleft()
        if clean:
            times = self.clean_times
            times.append(now)
            while now - times[0] > SITE_MEMORY:
                times.popleft()

    def _confirm_site(self, origin: str, site_gap: float, admitted_at: float,
                      now: float, margin: float = 0.0) -> list[Event]:
        """Clean answers while the budget paced the origin at the site's probe rate:
        SITE_CONFIRMATIONS of them, sent at 90 % of that pace or more, confirm it.
        ``margin``: what the budget adds to every 1/rate interval (its pace at a rate is
        that much under it)."""
        site = self.site
        if site is None or site.converged or admitted_at < site.changed_at:
            return []
        self.site_confirmations += 1
        self.site_gaps += site_gap
        if self.site_confirmations < SITE_CONFIRMATIONS:
            return []
        pace = self.site_confirmations / self.site_gaps
        self.site_confirmations, self.site_gaps = 0, 0.0
        target = site.target()
        paced = 1.0 / (1.0 / target + margin)  # what the budget sends at the target
        if pace < 0.9 * paced:
            return []  # demand, not the budget, set the pace: nothing learned
        before, was_proven = site.lo, site.proven
        # what really ran clean (the budget's own pace when within 5 % of it: a client
        # that runs a little behind would otherwise creep up in ever smaller steps)
        site.confirmed(target if pace >= 0.95 * target else pace, now)
        if site.lo == before and site.hi is not None and pace >= 0.95 * paced:
            # the budget ran clean at the target, but its margin keeps the pace under
            # what is known clean: probe further up, or a site rate recalled (or first
            # found) above its own pace is never raised, and paces ~10 % under the limit
            site.ran_clean_under()
        if site.hi is None and self.site_ceiling is None and site.lo >= self.max_rate:
            self.site = None  # no site limit left to respect
            return [Event(f"{self.kind}_rate_up", origin, None, f"{before:.3g} r/s -> no limit")]
        detail = raised(before, site.lo, was_proven)
        return [] if detail is None else [Event(f"{self.kind}_rate_up", origin, None, detail)]

    def _site_evidence(self, origin: str, exit_id: str, admitted_at: float, now: float,
                       sure: bool) -> list[Event]:
        """A 429 the pair's own spacing does not explain: the site, once two exits agree
        (``sure``: it came later after the pair's last clean request than a clean one
        did), or AMBIGUOUS_EXITS (it came as late as clean ones: arrival jitter at the
        pair's own limit does that too, now and then)."""
        blame = self._recent(self.site_blame, (now, exit_id, sure))
        spread = len({e for _, e, _ in blame})
        surely = len({e for _, e, is_sure in blame if is_sure})
        active = self.active_exits(now)
        # (once the site is known to be limited, such a 429 is its rate's doing)
        if self.site is None and surely < min(2, active) and \
                spread < min(AMBIGUOUS_EXITS, active):
            return []
        return self._site_limited(origin, spread, admitted_at, now)

    def _site_limited(self, origin: str, spread: int, admitted_at: float, now: float
                      ) -> list[Event]:
        """The origin is limited as a whole: the site rate starts (or goes) where the
        site actually took requests, once per congestion event (its probe's
        confirmations were reset by the 429 that brought us here)."""
        site = self.site
        if site is None:
            # early in a crawl these are counts over a fraction of a second, and the
            # first burst (one request per exit, discovery's) is no pace: a site at
            # 20 r/s refuses most of it, and read as a rate it had started the site at
            # 45 r/s, walked down by halves with a round of 429s each
            offered = self.offered_pace(now)
            accepted = self.accepted_rate(now)
            top = self.site_ceiling if self.site_ceiling is not None else self.max_rate
            # where the site took requests, but never under half what was sent, nor
            # under what it took over the last SITE_MEMORY seconds (blamed as exits come
            # back from the cooldowns a window's wall gave them, the last second took
            # next to nothing: a window of 20 per 10 s per IP started the site at 1.9 r/s)
            start = max(accepted, offered / 2, self._clean_rate(now, SITE_MEMORY),
                        self.min_rate)
            site = self.site = RateEstimate(min(start, top), floor=self.min_rate, ceiling=top)
            # no ceiling yet: what was sent on average tells little (a strict limit
            # refuses a burst of a few requests however slow the average); slow start
            # from where the site took requests finds it in a few steps
            site.changed_at = now
            return [Event(f"{self.kind}_limited", origin, None,
                          f"429s on {spread} exits: the site takes {site.lo:.3g} r/s "
                          f"of {offered:.3g}")]
        if admitted_at < site.changed_at:
            return []
        before, since = site.lo, site.changed_at
        # the budget's pace drew it (a strict site counts the spacing of arrivals);
        # decreases that follow each other within a second come harder
        target = site.target()
        self.site_streak = self.site_streak + 1 if now - self.site_decreased < 1.0 else 1
        self.site_decreased = now
        site.rejected(target, now, self.site_streak)
        # the share the site took of what the budget sent since the last change: where
        # the limit now is
        share = self.clean_share(since)
        if share is not None and target * share < site.lo:
            site.lo = max(target * share, site.lo * 0.5, site.floor)
        # ... but not under what it took over the last SITE_MEMORY seconds: a limit
        # counted over a window (N per minute) refuses for the rest of its window
        # whatever the pace, and must not walk the site rate down to the floor
        took = self._clean_rate(now, SITE_MEMORY)
        assert site.hi is not None
        site.lo = max(site.lo, min(took, site.hi * backoff(1)))
        return [Event(f"{self.kind}_rate_down", origin, None,
                      f"{before:.3g} -> {site.lo:.3g} r/s, ceiling {site.hi:.3g}")]

    def _recent(self, blame: deque, entry: tuple) -> deque:
        """``blame`` with ``entry`` (time first) added and what is older than the window
        taken out: SITE_WINDOW, or two of the pool's intervals when that is longer."""
        blame.append(entry)
        now = entry[0]
        window = self._blame_window()
        while now - blame[0][0] > window:
            blame.popleft()
        return blame

    def _blame_window(self) -> float:
        return SITE_WINDOW

    def admitted(self, exit_id: str, now: float) -> None:
        """An admission for the key, on ``exit_id``."""
        if not self.admissions and self.first_admission == math.inf:
            self.first_admission = now
        self.admissions.append((now, exit_id))
        while now - self.admissions[0][0] > 2.0:
            self.admissions.popleft()

    def drift(self, elapsed: float) -> None:
        if self.site is not None:
            self.site.drift(elapsed)

    # -- the key's rate as data: for other processes to adopt, for a later run ----------
    def rate_mark(self) -> tuple | None:
        """Changes whenever the key's learned rate does (not on ceiling drift)."""
        site = self.site
        return None if site is None else (site.lo, site.changed_at, site.proven)

    def export_rate(self) -> dict[str, Any] | None:
        return None if self.site is None else estimate_data(self.site)

    def load_rate(self, data: Mapping[str, Any] | None) -> None:
        """Adopt what another process learned of the key's rate (``export_rate``)."""
        if data is None:
            self.site = None
            return
        if self.site is None:
            self.site = RateEstimate(1.0)
        load_estimate(self.site, data)

    def remembered_rate(self) -> dict[str, Any] | None:
        """The key's rate for a later run, once proven (a scope's start rate is a guess)."""
        site = self.site
        return None if site is None or not site.proven else site.remembered()

    def recall_rate(self, data: Mapping[str, Any], now: float) -> None:
        """Start the key's rate from what an earlier run remembered (``remembered_rate``)."""
        top = self.site_ceiling if self.site_ceiling is not None else self.max_rate
        self.site = RateEstimate(top, floor=self.min_rate, ceiling=top)
        self.site.recall(data, now)

    # -- a named scope's feedback (the origin's goes through OriginLearner) ------------
    def scope_succeeded(self, label: str, gap: float, admitted_at: float, now: float
                        ) -> list[Event]:
        """A clean answer to a request admitted ``gap`` after the key's previous one."""
        self._answered(now, admitted_at, True)
        return self._confirm_site(label, gap, admitted_at, now) if self.site is not None \
            else []

    def scope_refused(self, now: float, admitted_at: float) -> None:
        """A 429 to a request the key admitted: no probe of its rate is clean now."""
        self._answered(now, admitted_at, False)
        self.site_confirmations, self.site_gaps = 0, 0.0

    def scope_evidence(self, label: str, exit_id: str, admitted_at: float, now: float,
                       sure: bool) -> list[Event]:
        """A 429 its pair's spacing does not explain, on a request that needed this key."""
        return self._site_evidence(label, exit_id, admitted_at, now, sure)


@dataclass(kw_only=True)
class OriginLearner(SharedRateLearner):
    pool: RateEstimate
    #: an exit's pair learning, when the pair exists
    learning_of: Callable[[str], PairLearning | None]
    scout: str | None = None
    scout_since: float = -math.inf
    #: while the start rate is a guess (the scout's), the exit trying twice that at
    #: once: proving the start rate takes a whole interval at it (0.5 s at 2 r/s, half
    #: the ramp on an origin with no limit), and a second exit's 429 is needed before
    #: the first one counts, so a leap that draws one costs no 429 a discovery would not
    leap: str | None = None
    #: its test is under way (admitted): the check on a scout's first 429 is then that
    #: test's answer; one not sent yet would wait its interval from the leap's first
    #: request, however late that went (broad crawls: first requests spread over a second)
    leap_sent: bool = False
    #: what the leap tries, in units of the start rate (1 or less: no leap)
    leap_factor: float = GROWTH
    #: the leap (under way, or the next one) is the far one: the first tries a power of
    #: ``leap_factor`` (``far_factor``: on an origin with no limit, proven in a sixteenth
    #: of a second at a start of 2 r/s, not a quarter); refused, it is the lone 429 a
    #: second exit must confirm, and another exit leaps ``leap_factor`` (its test due when
    #: the first leap's would have been: discovery under a per-IP limit goes as without it)
    leap_far: bool = True
    #: what the far leap tries, in units of the start rate: the cube of ``leap_factor``
    #: (8 x: 16 r/s, proven 1/16 s after the first request) where the answer that picks
    #: it came fast enough for a test that short, else (and until picked: None) the square
    #: (``FeedbackLaws._leap``)
    far_factor: float | None = None
    #: after the far leap's lone 429, the scout's check of it bisects under the rate the
    #: square would have tried (as if refused there), not under the 429: a check under a
    #: 429 at 16 r/s would go at 8, and under a 5 r/s limit draw one 429 more
    check_below: float = math.inf
    #: the far leap ran clean on a fast path: the scout's next step tries this rate, not
    #: twice the proven one (no limit: the lab's full pace, ~75 r/s per exit, 0.08 s
    #: sooner), until a step runs at it (JUMP_RAN). Refused, it is a scout's lone 429 like
    #: any other, and slow start steps on under it
    jump: float | None = None
    #: a jump ran clean: slow start climbs fast enough to meet a wall (a bucket's burst,
    #: a window's count) with several requests in flight on every exit (``wary``)
    jumped: bool = False
    #: the exit whose lone 429 set the pool's first ceiling, until a second one agrees
    suspect: str | None = None
    suspect_rate: float = math.inf
    #: the two exits whose 429s set the pool's ceiling (a lone one and the one that
    #: agreed): if both prove slower than the pool, the ceiling was theirs, not its
    ceiling_by: set[str] = field(default_factory=set)
    #: the pool's clean rate when those two set its ceiling
    ceiling_lo: float = math.inf
    #: they set it at the unproven start rate: a guess two exits refused (in a mixed
    #: pool, perhaps its two slow exits), not a limit the pool has probed near
    ceiling_at_start: bool = False
    #: recent 429s at the pool's pace that the pairs' spacing explains: (time, exit)
    pool_blame: deque[tuple[float, str]] = field(default_factory=deque)
    last_tick: float = -math.inf
    #: the latest 429 on the origin while slow start had found no ceiling (``wary``)
    slow_start_429: float = -math.inf

    def _blame_window(self) -> float:
        return max(SITE_WINDOW, 2.0 / self.pool.lo)

    # -- what to pace at -----------------------------------------------------
    def pair_rate(self, exit_id: str, pl: PairLearning) -> float:
        """The rate a pair paces at: its own limit's probe, the scout's, the leap's, else
        the pool's clean rate (as ``pool_pacing`` tells an exit search)."""
        if pl.own is not None:
            return pl.own.target()  # its own limit: it probes for itself
        if self.scout == exit_id:
            return self.probe_rate()
        if self.leap == exit_id:
            return self.leap_rate()
        return self.pool.lo

    def leap_rate(self) -> float:
        if not self.leap_far:
            factor = self.leap_factor
        else:
            factor = self.leap_factor ** 2 if self.far_factor is None else self.far_factor
        return min(self.pool.lo * factor, self.pool.ceiling)

    def quicken_far_leap(self, latency: float) -> bool:
        """An answer ``latency`` after its request, before the far leap's test went: where
        the answer that picked the leap was too slow for the cube and this one is fast
        enough, the test tries the cube (it goes at once if its interval at that rate is
        over). A first answer rides a cold connection: through the lab's proxies the first
        of ten came 17 ms after its request and the others from 11 ms, so the leap tried 8
        r/s, not 16, and its test went 90 ms later. Whether it changed."""
        if self.leap is None or not self.leap_far or self.leap_sent or \
                self.far_factor is None:
            return False
        cube = self.leap_factor ** 3
        if self.far_factor >= cube or not self.far_leap_tells(latency, cube):
            return False
        self.far_factor = cube
        return True

    def far_leap_tells(self, latency: float, factor: float) -> bool:
        """Whether a path whose answers come ``latency`` after their requests lets a far
        leap of ``factor`` times the start rate tell: its interval four times that
        (FAR_LEAP_LATENCY) or more."""
        return latency * FAR_LEAP_LATENCY <= 1.0 / min(self.pool.lo * factor, self.pool.ceiling)

    def wants_leap(self) -> bool:
        """Whether a leap is worth trying: a scout is proving a start rate not yet
        refused (after a 429, discovery has its second opinion to find, under it; the
        far leap's lone 429 leaves the near leap under it to try)."""
        pool = self.pool
        if self.suspect is not None and (self.leap_far or
                                         self.leap_rate() >= self.suspect_rate):
            return False
        return not pool.proven and pool.hi is None and \
            self.scout is not None and self.leap_rate() > pool.lo

    def probe_rate(self) -> float:
        """What the scout tries: the pool's next target, but while one exit's lone 429
        waits for a second opinion, the next exit checks it below that 429 (the middle of
        the gap, or the suspect's rate once the gap is narrow): if the 429 was the pool's
        ceiling its 429 there agrees and bisects at once; if it was a slow exit's own,
        the pool climbs through it."""
        pool = self.pool
        target = pool.target()
        if self.jump is not None and pool.proven and pool.hi is None and self.suspect is None:
            return max(target, min(self.jump, pool.ceiling))
        suspect = min(self.suspect_rate, self.check_below)
        if self.suspect is None or pool.hi is not None or not pool.proven or \
                not math.isfinite(suspect) or suspect <= pool.lo * (1 + 1e-9):
            return target
        if suspect > pool.lo * CLIMB_BELOW:
            return min(target, math.sqrt(pool.lo * suspect))
        return min(target, suspect)

    def jump_after_leap(self, latency: float) -> None:
        """The far leap ran clean, its answer ``latency`` after its request: the next step
        tries up to JUMP times the rate it proved, as fast as such a path's arrival jitter
        lets a test tell (a quarter of the interval, as for the far leap), and only when
        that is more than one step of slow start."""
        pool = self.pool
        rate = min(pool.lo * JUMP, pool.ceiling)
        if latency > 0:
            rate = min(rate, 1.0 / (latency * FAR_LEAP_LATENCY))
        if pool.proven and pool.hi is None and rate > pool.lo * GROWTH * 1.01:
            self.jump = rate

    def holds(self, exit_id: str, pl: PairLearning, sent_before: bool) -> bool:
        """Discovery: while the start rate is unproven, only the scout (and the leap)
        send twice (``PoolPacing.holding``: it is proven)."""
        return (not self.pool.proven and sent_before and pl.own is None
                and self.scout is not None and self.scout != exit_id
                and self.leap != exit_id)

    def wary(self, pl: PairLearning, now: float) -> bool:
        """Slow start jumped, then met a 429 on one of the pool's exits within WARY
        seconds, the pool's ceiling not yet found: the pool's exits send one request at a
        time, so that a wall (a bucket's burst or a window's count spent on every exit at
        once) draws one 429 per exit, not a round of all they had in flight. (Without a
        jump the climb is slower and the wall's round smaller; held there too, the lab's
        mixed pool drew one 429 more, 17 against 16, in each of three runs.)"""
        pool = self.pool
        return self.jumped and pl.own is None and pool.hi is None and \
            now - self.slow_start_429 < WARY

    def estimate(self, pl: PairLearning) -> RateEstimate:
        """The limit a pair paces by: its own, or the pool's."""
        return pl.own if pl.own is not None else self.pool

    def near_limit(self, pl: PairLearning) -> bool:
        """Whether a limit is known close by: then pacing allows for arrival jitter."""
        return self._near(self.estimate(pl))

    def given_limit(self, pl: PairLearning) -> bool:
        """Whether the pair paces at a rate given (configured, or stated by the server),
        not at one learned under it."""
        return self._at_given(self.estimate(pl))

    def pool_pacing(self) -> PoolPacing:
        pool = self.pool
        return PoolPacing(pool.lo, self._near(pool), self._at_given(pool),
                          (self.scout, self.leap), not pool.proven)

    def _near(self, est: RateEstimate) -> bool:
        return est.hi is not None or self._given(est)

    def _at_given(self, est: RateEstimate) -> bool:
        return est.lo >= est.ceiling and self._given(est)

    def _given(self, est: RateEstimate) -> bool:
        """Whether ``est`` is a rate given (configured, or stated by the server): its
        ceiling is that rate, not the tuning's ``max_rate``."""
        return est.ceiling < self.max_rate

    # -- admission -------------------------------------------------------------
    def granted(self, exit_id: str, pl: PairLearning, now: float) -> bool:
        """An admission on ``exit_id``; True when it made the exit the scout."""
        self.admitted(exit_id, now)
        if exit_id == self.leap:
            self.leap_sent = True
        if self.scout is None and self.may_scout(pl, now) and (
                self.probe_rate() > self.pool.lo or not self.pool.proven):
            self.scout, self.scout_since = exit_id, now
            pl.confirmations, pl.confirmed_rate = 0, math.inf
            return True
        return False

    @staticmethod
    def may_scout(pl: PairLearning, now: float) -> bool:
        """A scout probes for the pool: not an exit with a limit of its own, nor one that
        drew a 429 lately (in a mixed pool, the slow exits; a probe there says nothing
        about the others)."""
        return pl.own is None and now - pl.last_429 > SCOUT_QUIET

    def tick(self, now: float, pairs: Iterable[PairLearning],
             admitted_everywhere: Callable[[float], int]) -> None:
        """Time-driven parts: ceilings drift, a stuck scout hands its probe on, and the
        pool refines under its last 429 only while the crawl is mostly this origin (half
        or more of the last second's admissions over every origin,
        ``admitted_everywhere(now)``): in a broad crawl each origin's pages are few, and
        that probe is one more 429 for a few per cent of them."""
        elapsed = now - self.last_tick
        if elapsed < 1.0:
            return
        self.last_tick = now
        self.pool.refine = 2 * self.admitted_count(now, 1.0) >= admitted_everywhere(now)
        if math.isfinite(elapsed):
            self.pool.drift(elapsed)
            super().drift(elapsed)
            for pl in pairs:
                if pl.own is not None:
                    pl.own.drift(elapsed)
        if self.scout is not None:
            patience = SCOUT_PATIENCE / max(self.pool.target(), 1e-9)
            if now - self.scout_since > max(patience, 2.0):
                self.scout = None

    # -- feedback ----------------------------------------------------------------
    def succeeded(self, origin: str, exit_id: str, pl: PairLearning, *, rate: float,
                  gap: float, margin: float, admitted_at: float, site_gap: float, now: float,
                  configured: bool, site_margin: float = 0.0, anchored: float = 0.0,
                  spread: float = 0.0) -> list[Event]:
        """A clean answer to a request admitted at pair pace ``rate``, ``gap`` after the
        pair's previous one (``margin``: what pacing adds to every 1/rate interval: the
        safety margin and the arrival spread; ``anchored``: how far the answer before it
        pushed the pair's next token on, re-anchoring pacing on when it arrived;
        ``spread``: how much later than the fastest its answers come), ``site_gap`` after
        the origin's previous one."""
        self._answered(now, admitted_at, True)
        # what the pair really achieved: its pacing rate, or less when something else
        # (its concurrency, latency, demand, the site budget) spaced the requests wider.
        # Proving a start rate, the pace is on trial, not the path: less the time pacing
        # waited for the path (until a pair's path is warm its next request goes an
        # interval after the answer, and on a path with 100 ms of latency a 2 r/s start
        # was proven only by a rare fast answer: seconds at 1 r/s per exit), and less the
        # lateness an admission may have after its token (a timer fires when the event
        # loop is free, a few ms late, and at high rates that alone made the scout look
        # demand-bound: a start rate of 100 r/s or more was never proven, and every
        # other exit held for it)
        late = 0.0
        if not self.estimate(pl).proven:
            late = anchored
            if rate * ADMIT_LATE >= LATE_SHARE and not self.near_limit(pl):
                late += ADMIT_LATE
        achieved = min(rate, 1.0 / max(gap - margin - late, 1e-6))
        if achieved >= rate * 0.95:  # the rate itself ran clean
            pl.rate_streak = 0
        if admitted_at > pl.last_clean:
            pl.clean_gaps.append((now, admitted_at - pl.last_clean))
            pl.last_clean = admitted_at
        events = self._confirm_pair(origin, exit_id, pl, achieved, admitted_at, now,
                                    configured, spread)
        if self.site is not None:
            events += self._confirm_site(origin, site_gap, admitted_at, now, site_margin)
        return events

    def _confirm_pair(self, origin: str, exit_id: str, pl: PairLearning, achieved: float,
                      admitted_at: float, now: float, configured: bool, spread: float = 0.0
                      ) -> list[Event]:
        own = pl.own is not None
        est = self.estimate(pl)
        leaping = not own and self.leap == exit_id
        probing = own or self.scout == exit_id or leaping
        # proving a start rate: paced at it (the safety margin spaces a little wider);
        # probing above: faster than what is known clean
        if est.proven:
            counts = achieved > est.lo * (1 + 1e-9)
        else:
            counts = achieved >= est.lo * 0.9
        if not probing or not counts or admitted_at < est.changed_at:
            return []
        pl.confirmations += 1
        pl.confirmed_rate = min(pl.confirmed_rate, achieved)
        # (a ceiling two exits set at the start rate is probed as slow start is, until
        # a probe under it draws a 429: if it was two slow exits', the pool climbs
        # through it in one step a time, and three confirmations a step had held the
        # other exits at 1 r/s for seconds; if it is the pool's, that 429 comes as soon)
        needed = CONFIRMATIONS if est.hi is None or not est.proven or (
            not own and self.ceiling_at_start and self.ceiling_by) else \
            CONFIRMATIONS_NEAR_CEILING
        if not own and self.suspect is not None and est.proven:
            needed = CONFIRMATIONS_NEAR_CEILING  # under a lone 429: perhaps the ceiling
        # a step that shortens the interval by less than the path's arrival spread is
        # within what jitter does to one request: one clean answer there is luck
        if est.proven and spread >= 1.0 / est.lo - 1.0 / pl.confirmed_rate:
            needed = max(needed, CONFIRMATIONS_NEAR_CEILING)
        if pl.confirmations < needed:
            return []
        confirmed, pl.confirmations, pl.confirmed_rate = pl.confirmed_rate, 0, math.inf
        before, was_proven = est.lo, est.proven
        est.confirmed(confirmed, now)
        if not own:
            if self.jump is not None and confirmed >= self.jump * JUMP_RAN:
                self.jump, self.jumped = None, True
            if self.leap is not None:  # the start rate is settled, one way or the other
                self.leap = None
                if leaping:  # slow start goes on from the leap, a step ahead of the scout
                    self.scout, self.scout_since = exit_id, now
            if est.hi is not None:  # bisecting: another exit takes the next probe
                self.scout = None
            else:  # slow start: the scout goes on, its pace already up to speed
                pl.confirmations, pl.confirmed_rate = 0, math.inf
            # (within rounding: a climb that reached 3.9999999 under a 429 at 4 had
            # probed at 4 for good, never counted above what was clean)
            if self.suspect is not None and est.lo * (1 + 1e-9) >= self.suspect_rate:
                self.suspect = None  # the lone 429 was the suspect's own limit
        # a pair that learned its own limit rejoins the pool's once it reaches it
        if own and not configured and est.lo >= self.pool.lo * (1 - 2 * RESOLUTION) \
                and self.pool.proven:
            pl.own = None
            pool = self.pool
            if est.hi is not None and (pool.hi is None or est.hi < pool.hi):
                # it is like the others after all: the ceiling it found is the pool's
                pool.hi, pool.seen = est.hi, est.seen
                pool.lo = min(max(pool.lo, est.lo), est.hi)
                pool.settled = pool.converged
        detail = raised(before, est.lo, was_proven)
        return [] if detail is None else [Event("rate_up", origin, exit_id if own else None,
                                                 detail)]

    def rate_limited(self, origin: str, exit_id: str, pl: PairLearning, *, rate: float,
                     gap: float, admitted_at: float, now: float,
                     slack: float, origin_slack: Callable[[], float] = lambda: 0.0,
                     pick_scout: Callable[[Sequence[str]], str | None],
                     scopes: Sequence[tuple[str, SharedRateLearner]] = (),
                     foreign_before: float = -math.inf) -> list[Event]:
        """A 429 to a request admitted at pair pace ``rate``, ``gap`` after the pair's
        previous one: decide which scope it points at, and learn there.

        A per-IP limit (a GCRA) accepts a request when it comes far enough after the
        last one it accepted: its 429s come closer after the pair's last clean request
        than any clean one did. A 429 that came as late as a clean request did (give
        or take ``slack``, the arrival jitter), or on a first request, is not the
        pair's limit: it points at the site, or, when the request needed named scopes
        whose rates are learned (``scopes``: id and learner), at those scopes.
        ``origin_slack()``: the widest arrival jitter any of the origin's pairs saw (what
        a scout's 429 proves); asked only for a scout's 429, as it walks every pair.
        ``foreign_before``: another process's latest admission on the pair before this
        one (a shared backend).
        """
        self._answered(now, admitted_at, False)
        pl.last_429 = now
        if self.pool.hi is None and pl.own is None:
            self.slow_start_429 = now
        pl.confirmations, pl.confirmed_rate = 0, math.inf
        # any 429 ends the leap (what it would try is no longer the next step); a test
        # it has under way is the second opinion a scout's first 429 needs
        leap, self.leap = self.leap, None
        self.jump = None
        leaping = leap == exit_id
        check = leap if self.leap_sent and not leaping else None
        self.site_confirmations, self.site_gaps = 0, 0.0  # no site probe is clean now
        clean_gap = admitted_at - pl.last_clean
        # (a pair's first clean request has no gap: until it has one, the pool's proven
        # rate says what pace per IP the site takes; without either, it is the pair's)
        recent = [g for at, g in pl.clean_gaps if now - at <= RECENT and math.isfinite(g)]
        fastest = min(recent, default=math.inf)
        reference = fastest
        # the fastest pace the server took from the pair lately (None: it took nothing
        # lately, after a pause or a cooldown: no bound, rather than the floor)
        taken = 1.0 / fastest if recent else None
        by_pool = not recent and pl.own is None and self.pool.proven
        if by_pool:
            reference = 1.0 / self.pool.lo
        # judged by the pool's pace alone (a clean answer, but no spacing of its own), a
        # 429 later than it is as likely this pair's own slower limit (a mixed pool's slow
        # exits) as the site's: ambiguous evidence. (On a pair's very first request it is
        # surely not the pair's.)
        by_pool_only = by_pool and math.isfinite(clean_gap)
        closer = clean_gap < reference * CLEARLY_CLOSER - slack
        # (a shared pair: this process sees a share of its requests, and its own gaps run
        # wide; later than a clean one only if also after another process's admission,
        # counted as accepted, as most are: three processes' 429s at the pair's pace on
        # two exits had read as the site's, its rate one process's share)
        wider = admitted_at - max(pl.last_clean, foreign_before) > \
            reference * (1 + RESOLUTION / 2) + slack
        if math.isfinite(clean_gap):
            # the server now refuses this spacing from this pair: the clean gaps as close
            # as this one that came before no longer show that it takes it (a per-IP limit
            # that tightened: the pair's next 429 at this pace is then clearly its own)
            refused = clean_gap * (1 + RESOLUTION / 2) + slack
            kept = [(at, g) for at, g in pl.clean_gaps if g > refused]
            pl.clean_gaps.clear()
            pl.clean_gaps.extend(kept)
        # what the 429 says: the limit is under the pace it was paced at (or faster)
        pace = 1.0 / clean_gap if clean_gap > 0 else math.inf
        rate = max(rate, min(1.0 / gap if gap > 0 else 0.0, pace))
        pool = self.pool
        if leaping and self.wants_leap() and not wider and math.isfinite(clean_gap) and \
                self.active_exits(now) > 1:
            # the leap refused: a lone 429, as a scout's first one is; the scout goes on
            # proving the start rate (and after the far leap, another exit tries less)
            far, self.leap_far = self.leap_far, False
            events = self._lone_429(origin, exit_id, pl, rate, now)
            if far:
                self.check_below = self.pool.lo * self.leap_factor ** 2
            return events
        if self.scout == exit_id and (rate > pool.lo * (1 + 1e-9) or not pool.proven) and (
                not wider and math.isfinite(clean_gap)):
            # what the 429 proves: arrivals may have come as much closer than sent as
            # any of the origin's pairs saw them spread (this pair may not know yet)
            late = max(slack, origin_slack())
            proven = 1.0 / (clean_gap - late) if clean_gap > late else math.inf
            return self._probe_failed(origin, exit_id, pl, rate, admitted_at, now, pick_scout,
                                      proven=max(rate, proven), check=check)
        own = pl.own
        if exit_id == self.suspect and self.site is not None:
            # a lone 429's exit, awaiting a second opinion while the site's budget paces
            # the origin: its 429s are the site's as likely as its own, and a second exit
            # decides (4 exits under 8 r/s for the site, no per-IP limit: the suspect had
            # walked its own limit down to the 2 r/s the budget gave it)
            return self._site_evidence(origin, exit_id, admitted_at, now, wider)
        if own is not None and rate > own.lo * (1 + 1e-9) and not wider:
            # a pair probing its own limit found it
            return self._lower(origin, exit_id, own, rate, pl.rate_streak, admitted_at, now,
                               taken)
        if not closer and self.active_exits(now) > 1:  # (one exit alone: it is the pair)
            if scopes:  # a key the request carries, whatever exit it left from
                return [ev for key, scope in scopes
                        for ev in scope.scope_evidence(key, exit_id, admitted_at, now, wider)]
            if not self._pool_jitter(pl, wider, now):
                return self._site_evidence(origin, exit_id, admitted_at, now,
                                           wider and not by_pool_only)
            if pl.own is None:  # jitter meets every exit alike: the pool's, or no one's
                return self._pool_429(origin, exit_id, pl, rate, admitted_at, now) or []
            # (a given rate met by jitter: the pair settles under it, as below)
        if pl.own is not None:
            return self._lower(origin, exit_id, pl.own, rate, pl.rate_streak, admitted_at, now,
                               taken)
        events = self._pool_429(origin, exit_id, pl, rate, admitted_at, now)
        if events is not None:
            return events
        if now - pl.strike > STRIKE_WINDOW and not self._outpaced(exit_id):
            pl.strike = now  # once may be the site's: twice alone is this exit's
            return []
        # the pool's known-clean rate is too fast for this exit: it learns its own
        own = pl.own = self._slow_estimate(rate)
        backed_off = rate * backoff(pl.rate_streak)
        own.lo = max(own.floor, backed_off if taken is None else min(backed_off, taken))
        own.hi = own.seen = rate
        own.changed_at = now
        events = [Event("rate_down", origin, exit_id,
                        f"slower than the pool: {rate:.3g} -> {own.lo:.3g} r/s")]
        if exit_id in self.ceiling_by:
            self.ceiling_by.discard(exit_id)
            if not self.ceiling_by:  # both exits that set it are slower than the pool
                pool.forget_ceiling(now)
                events.append(Event("rate_up", origin, None,
                                    "the pool's ceiling was two slow exits' own: "
                                    f"slow start again from {pool.lo:.3g} r/s"))
        return events

    def _probe_failed(self, origin: str, exit_id: str, pl: PairLearning, rate: float,
                      admitted_at: float, now: float,
                      pick_scout: Callable[[Sequence[str]], str | None],
                      proven: float, check: str | None = None) -> list[Event]:
        """The scout's probe drew a 429: the pool's ceiling, once two exits agree.
        ``proven``: the rate the 429 shows the limit is under, allowing for jitter;
        ``check``: the leap, when its test (twice the start rate) is under way: its
        answer is the second opinion on a first 429 (a 429 agrees; clean, this exit is
        slower than the pool)."""
        pool = self.pool
        self.scout = None
        if pool.hi is None and self.active_exits(now) > 1:
            if self.suspect is None or self.suspect == exit_id:
                # one exit's 429 is not yet the pool's ceiling: another exit checks it
                events = self._lone_429(origin, exit_id, pl, rate, now)
                self.scout = check if check is not None else pick_scout([exit_id])
                return events
            # a second exit agrees: it was the pool's ceiling after all
            suspect = self.learning_of(self.suspect)
            if suspect is not None:
                suspect.own = None
            # (checked below the suspect's rate: a 429 there that jitter may explain
            # agrees only on the suspect's)
            rate = min(proven, self.suspect_rate)
            agreed = {self.suspect, exit_id}
            self.suspect = None
        else:
            agreed = set()  # a scout's probe under a known ceiling: the pool's
        at_start = not pool.proven  # the ceiling is set at the start rate
        if at_start:
            self.scout = pick_scout([exit_id])
        events = self._lower(origin, None, pool, rate, pl.rate_streak, admitted_at, now)
        if events:
            self.ceiling_by, self.ceiling_lo = agreed, pool.lo
            self.ceiling_at_start = at_start and bool(agreed)
        return events

    def _lone_429(self, origin: str, exit_id: str, pl: PairLearning, rate: float,
                  now: float) -> list[Event]:
        """A first 429 while the pool has no ceiling: ``exit_id``'s own limit (the
        suspect's, with an estimate of its own) until another exit agrees."""
        pool = self.pool
        if self.suspect not in (None, exit_id):  # a lower 429 says more: the first rejoins
            earlier = self.learning_of(self.suspect)
            if earlier is not None:
                earlier.own = None
        self.suspect, self.suspect_rate, self.check_below = exit_id, rate, math.inf
        pl.own = RateEstimate(pool.lo, floor=self.min_rate, ceiling=pool.ceiling,
                              proven=pool.proven)
        pl.own.rejected(rate, now, pl.rate_streak)
        return [Event("rate_down", origin, exit_id,
                      f"429 at {rate:.3g} r/s: this exit's own, until another exit agrees")]

    def _outpaced(self, exit_id: str) -> bool:
        """Whether ``exit_id`` set the pool's ceiling and the pool has since run clean
        OUTPACED times faster than it did then: a 429 there at the pool's pace is this
        exit's own limit at once (two slow exits that scouted first had held the pool
        under their ceiling for seconds, each waiting out a strike)."""
        return exit_id in self.ceiling_by and self.pool.lo >= self.ceiling_lo * OUTPACED

    def _lower(self, origin: str, exit_id: str | None, est: RateEstimate, rate: float,
               streak: int, admitted_at: float, now: float, taken: float | None = None
               ) -> list[Event]:
        """Learn a 429 at ``rate`` once per congestion event; ``taken``: the fastest pace
        the server recently took from this pair (its own limit is no slower; None: it took
        nothing lately)."""
        if admitted_at < est.changed_at:
            return []  # same congestion event as an earlier 429
        before = est.lo
        est.rejected(rate, now, streak)
        if taken is not None:
            if taken < est.lo:  # straight to what the server took, not down in small steps
                est.lo = max(taken, est.floor)
            elif est is not self.pool:
                # a pair's own limit: the pace it just took is clean, however far under
                # it earlier 429s had put the estimate (a streak's backoff, a gap that
                # spanned a cooldown): a pair under a given rate climbs to a raised limit
                # from there (``rejected`` has just set the ceiling)
                assert est.hi is not None
                est.lo = max(est.lo, min(taken, est.hi * backoff(1)))
        return [Event("rate_down", origin, exit_id,
                      f"429 at {rate:.3g} r/s: clean {before:.3g} -> {est.lo:.3g}, "
                      f"ceiling {est.hi:.3g}")]

    def _pool_429(self, origin: str, exit_id: str, pl: PairLearning, rate: float,
                  admitted_at: float, now: float) -> list[Event] | None:
        """A 429 at the pool's pace: what the pool learns ([] for old news), or None when
        it is one exit's alone so far."""
        pool = self.pool
        if admitted_at < pool.changed_at:
            return []  # the pool's rate changed since: this 429 is old news
        # the pool's pace drawing 429s on many exits (its raise was wrong, or the
        # limit moved down for every exit): the pool learns it at once; from
        # HALVE_EXITS exits on, the limit is well under that pace: it halves
        exits = self._pool_too_fast(exit_id, now)
        if not exits:
            return None
        if exits >= HALVE_EXITS and self._just_raised(now):
            # right after a raise: the raise was wrong (one clean answer on a jittery
            # path, luck), not the limit moved: back to where the pool last ran clean
            events = self._lower(origin, None, pool, rate, pl.rate_streak, admitted_at, now,
                                 pool.raised_from)
        else:
            streak = max(pl.rate_streak, len(BACKOFF_BY_STREAK)) if exits >= HALVE_EXITS \
                else pl.rate_streak
            events = self._lower(origin, None, pool, rate, streak, admitted_at, now)
        # a pace far over what the site took per exit over the last SITE_MEMORY seconds
        # (slow start climbed on a burst's or a window's count, then met its wall): down
        # to what it took at once, not by halves a round (a cooldown) at a time; only
        # once answers tell (a test of the laws alone, or a crawl's first answers)
        if events and len(self.clean_times) >= MIN_SHARE_ANSWERS:
            took = self._clean_rate(now, SITE_MEMORY) / max(self.active_exits(now), 1)
            if took * STORM_OVER < pool.lo:
                pool.lo = max(took, pool.floor)
        return events

    def _pool_jitter(self, pl: PairLearning, wider: bool, now: float) -> bool:
        """Whether a 429 as late after the pair's last clean request as clean ones came
        (give or take its arrival jitter) is the per-IP limit met by jitter, not the
        site's: the pair paces at the pool's rate and the pool has found its ceiling, or
        at a rate given it (configured or stated by the server), and the site takes
        nearly all it is sent (under SITE_REFUSED 429s over the last second). A site
        limit the pool's pace went past refuses a good share; jitter at a per-IP limit
        now and then, on any exit, and three exits within the blame window
        had read as a site limit: the site budget then held the whole origin down."""
        if wider or self.site is not None:
            return False
        own = pl.own
        if own is not None and not self._given(own):
            return False  # its own limit, learned
        if own is None and self.pool.hi is None:
            return False
        share = self.refused_share(now)
        return share is not None and share < SITE_REFUSED

    def _just_raised(self, now: float) -> bool:
        """Whether slow start raised the pool's rate within RECENT seconds: one clean
        answer far from any known ceiling, a jittery path's luck now and then (a pool
        raised over the per-IP limit that way had its 429s read as a site limit)."""
        return self.pool.raised_from is not None and now - self.pool.raised_at <= RECENT

    def _pool_too_fast(self, exit_id: str, now: float) -> int:
        """Exits 429 at the pool's pace, each its own limit's doing: many of them
        (POOL_SHARE of those in use, at least two) within a window say the pool's rate
        is wrong; fewer are exits slower than the pool. Returns how many (0: fewer)."""
        blame = self._recent(self.pool_blame, (now, exit_id))
        spread = len({e for _, e in blame})
        if spread < max(2, math.ceil(POOL_SHARE * self.active_exits(now))):
            return 0
        blame.clear()
        return spread

    # -- sharing -------------------------------------------------------------------
    def mark(self) -> tuple:
        return (self.pool.lo, self.pool.changed_at, self.pool.proven, self.scout, self.leap,
                self.leap_far, self.far_factor, self.check_below, self.jump, self.jumped,
                self.slow_start_429, self.rate_mark())

    def export(self) -> dict[str, Any]:
        return {
            "estimate": estimate_data(self.pool),
            "site": self.export_rate(),
            "scout": self.scout,
            "scout_since": self.scout_since,
            "leap": self.leap,
            "leap_sent": self.leap_sent,
            "leap_far": self.leap_far,
            "far_factor": self.far_factor,
            "check_below": self.check_below if math.isfinite(self.check_below) else None,
            "jump": self.jump,
            "jumped": self.jumped,
            "slow_start_429": self.slow_start_429 if math.isfinite(self.slow_start_429)
            else None,
            "suspect": self.suspect,
            "suspect_rate": self.suspect_rate if math.isfinite(self.suspect_rate) else None,
            "ceiling_by": sorted(self.ceiling_by),
            "ceiling_lo": self.ceiling_lo if math.isfinite(self.ceiling_lo) else None,
            "ceiling_at_start": self.ceiling_at_start,
        }

    def load(self, data: Mapping[str, Any]) -> None:
        """Adopt another process's ``export`` (a scout this pool lacks is handed on at
        this process's next admission for the origin: ``Limiter._tick``)."""
        load_estimate(self.pool, data["estimate"])
        self.load_rate(data.get("site"))
        self.scout = data["scout"]
        self.scout_since = data["scout_since"]
        self.leap = data.get("leap")
        self.leap_sent = bool(data.get("leap_sent", False))
        self.leap_far = bool(data.get("leap_far", True))
        self.far_factor = data.get("far_factor")
        check_below = data.get("check_below")
        self.check_below = math.inf if check_below is None else check_below
        self.jump = data.get("jump")
        self.jumped = bool(data.get("jumped", False))
        wary = data.get("slow_start_429")
        self.slow_start_429 = -math.inf if wary is None else wary
        self.suspect = data.get("suspect")
        rate = data.get("suspect_rate")
        self.suspect_rate = math.inf if rate is None else rate
        self.ceiling_by = set(data.get("ceiling_by", ()))
        ceiling_lo = data.get("ceiling_lo")
        self.ceiling_lo = math.inf if ceiling_lo is None else ceiling_lo
        self.ceiling_at_start = bool(data.get("ceiling_at_start", False))

    # -- across runs (warm start) ------------------------------------------------
    def remembered(self, allowance: float = 0.0) -> dict[str, Any] | None:
        """What the origin's answers taught, for a later run: the pool's per-IP rate once
        proven, the site's once found (None: nothing yet). ``allowance``: the arrival
        jitter the pool's pairs allowed for on top of their rate (a new run's pairs start
        without it, so it is folded into the rate)."""
        pool = self.pool.remembered(allowance) if self.pool.proven else None
        site = self.remembered_rate()
        if pool is None and site is None:
            return None
        return {"pool": pool, "site": site}

    def recall(self, data: Mapping[str, Any], now: float) -> None:
        """Start from what an earlier run remembered: no discovery, the site budget in
        place from the first request."""
        if data.get("pool"):
            self.pool.recall(data["pool"], now)
        if data.get("site"):
            self.recall_rate(data["site"], now)

    @staticmethod
    def remembered_pair(pl: PairLearning, allowance: float = 0.0) -> dict[str, Any] | None:
        """A pair's own limit, when it learned one (a stated quota is stated again)."""
        own = pl.own
        if own is None or not own.proven or pl.announced is not None or (
                own.hi is None and own.lo >= own.ceiling):
            return None
        return own.remembered(allowance)

    def recall_pair(self, pl: PairLearning, data: Mapping[str, Any], now: float) -> None:
        if pl.own is None:  # (a configured pair keeps its own estimate: its ceiling)
            pl.own = self._slow_estimate(float(data["clean"]))
        pl.own.recall(data, now)

    def _slow_estimate(self, rate: float) -> RateEstimate:
        """The own limit of an exit slower than the pool, learned coarsely: it carries
        little of the crawl, and every probe of it costs a 429."""
        return RateEstimate(rate, floor=self.min_rate, ceiling=self.pool.ceiling,
                            resolution=SLOW_RESOLUTION, drift_rate=SLOW_DRIFT)


def raised(before: float, after: float, was_proven: bool) -> str | None:
    """What a confirmation did to a rate, for its rate_up event: ``before -> after r/s``
    with the digits that tell them apart, ``after r/s proven`` for a start rate (a guess
    until now) that did not move, None when nothing moved (no event to log or count: a
    site probe that ran clean under its rate came ~5 times a second)."""
    if after == before:
        return None if was_proven else f"{after:.3g} r/s proven"
    digits = 3
    while digits < 6 and f"{before:.{digits}g}" == f"{after:.{digits}g}":
        digits += 1
    return f"{before:.{digits}g} -> {after:.{digits}g} r/s"


_ESTIMATE_FIELDS = ("lo", "hi", "floor", "ceiling", "changed_at", "proven", "seen",
                    "drift_rate", "climbs", "settled", "resolution", "raised_from",
                    "raised_at")


def estimate_data(est: RateEstimate) -> dict[str, Any]:
    return {name: getattr(est, name) for name in _ESTIMATE_FIELDS}


def load_estimate(est: RateEstimate, data: Mapping[str, Any]) -> None:
    for name in _ESTIMATE_FIELDS:
        if name in data:
            setattr(est, name, data[name])
