"""Shared exit state in Redis: many ``scrapy crawl`` processes, one set of limits per exit.

Each admission is one round trip: a Lua script checks the origin budget, the
pair buckets, cooldowns and bans, and the exits' lease counts for a list of
candidate exits, and either takes them all (granting up to ``want`` leases)
or answers how long to wait. Time is Redis ``TIME``; this process runs its
control laws on a clock that follows Redis time, so what it writes into
shared state is in Redis time too.

What is shared: pacing (GCRA) per pair, cooldowns and bans per pair,
evictions per exit, leases per exit (with expiry, renewed by a heartbeat, so
a killed process frees its places within ``LEASE_TTL``), the origin budget,
and what the pool learned per origin (a versioned blob, updated by
compare-and-set: an update made from stale knowledge loses and the current
state is adopted, so one congestion event lowers the rate once across all
processes). The blob outlives the processes (EXITLIMIT_STATE_MAX_AGE after its
last write or use): processes started later begin from it (warm start), and an
EXITLIMIT_STATE_FILE seeds a Redis that has nothing for an origin.

When Redis goes away mid-crawl the crawl goes on, by default on local state:
the processes the heartbeat last showed split the exits between them by
rendezvous hashing (each its own exits at their full rate, so none collide);
a process that never saw the member list paces every pair at 1/N of its rate.
Or it pauses (``EXITLIMIT_REDIS_ON_ERROR = "pause"``). It reconnects with
backoff; when Redis is back each process registers its leases again and seeds
Redis with its exits' schedules, holds and what it learned (the later deadline
wins; an empty, restarted Redis gets what the processes knew), and keeps to its
own exits until every process it split the pool with has rejoined.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import random
import socket
import time
import uuid
from collections.abc import Coroutine, Sequence
from importlib import resources
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred

from ..config import read_setting
from ..core import Candidate, Event, Lease
from ..core.changes import ExitEvicted, Feedback, Hold, OriginHeld, PairHeld
from ..core.limiter import INDEX_ABOVE
from ..core.partition import share
from ..core.scopes import Scope
from ..core.warm import recall, remember
from ..state_file import StateFileError, parse_origins
from .base import Admission, Backend
from .channel import ScriptChannel, open_channel

try:
    import redis
    import redis.asyncio as aioredis
except ImportError as exc:  # pragma: no cover - the redis extra is missing
    raise ImportError("the Redis backend needs redis-py: pip install 'scrapy-exitlimit[redis]'") \
        from exc

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from ..config import ExitLimitConfig
    from ..core.bucket import ArrivalFloor, TokenBucket

logger = logging.getLogger(__name__)

#: a lease not renewed for this long is free again (its process died)
LEASE_TTL = 15.0
#: presence (who shares the pool: the partition if Redis is lost) and lease renewal
HEARTBEAT = 1.0
#: candidate exits sent per admission (the best this process knows of): the first
#: FIRST_CANDIDATES + wanted in one call, the rest in a second only when needed
MAX_CANDIDATES = 32
FIRST_CANDIDATES = 4
#: large pools: the exits this process used last, tried first (warm connections)
WARM_KEEP = 96
#: Redis key strings kept ready, at most
KEY_CACHE = 100_000
#: exits busy with other processes' leases: look again this soon (their
#: releases do not wake this process)
LEASE_POLL = 0.05
RECONNECT_BACKOFF = (0.25, 0.5, 1.0)
#: back from an outage, a process keeps to its share of the exits until every process it
#: split the pool with has rejoined (and seeded Redis with its exits' schedules), at most
#: this long (a process that died meanwhile never does)
HANDOVER = 5.0
#: a sticky request pinned to an exit another process holds in a partition looks again
PARTITION_POLL = 0.5
#: Redis back empty: a process that learned nothing while it was away waits this long
#: for one that did to put what it learned in first
SEED_DELAY = 2.0
#: a call finding no token ready may be given the earliest one due within this many
#: seconds (and half its pair's interval), reserved at its time: processes woken together
#: for one token do not all call again for it (the caller waits for the time, then sends)
RESERVE_AHEAD = 0.25
#: a reserved lease not asked for this long after its time is given back unused: sent
#: later, it could land too close to its pair's next token, taken by another process
#: (the pacing margin, EXITLIMIT_SAFETY_MARGIN, absorbs less)
HELD_LATE = 0.01
#: a shared budget's lease handed out this long after its token's time re-anchors the
#: budget on when it goes (less is not worth the arguments a call carries)
SENT_LATE = 0.0002
#: releases wait for an admission call due within this long, to ride along with it
RELEASE_WAIT = 0.1
#: a release waits this long for a call to ride along with (the next admission, usually);
#: other processes see the freed place that much later, pacing is not shifted
RELEASE_DELAY = 0.025
#: what this process learned is looked at (a walk over the origin's pairs) at most this
#: often after quiet answers, and per LEARN_CHECK_PAIRS pairs that much less often (a
#: large pool's walk costs what a small pool's does per second); feedback with events
#: that may change what was learned is looked at, and published, at once
LEARN_CHECK = 0.05
LEARN_CHECK_PAIRS = 200
#: how often a learned scope in use is read back from Redis (seconds): a scope's
#: version does not ride along with admissions as an origin's does
SCOPE_PULL = 0.5
#: the script's pair field for each kind of hold
HOLD_FIELDS = {Hold.COOLDOWN: "cool", Hold.BAN: "ban"}
#: how often the learned state of the origins in use is kept alive in Redis (seconds)
LEARN_TOUCH = 60.0
#: scrapy-redis settings -> redis-py arguments
_SCRAPY_REDIS = {"REDIS_HOST": "host", "REDIS_PORT": "port", "REDIS_DB": "db"}


class RedisUnavailable(RuntimeError):
    """Redis could not be reached when the crawl started."""


def redis_settings(settings: Any, timeout: float | None = None
                   ) -> tuple[str | None, dict[str, Any], str]:
    """(url, client arguments, where they came from), from EXITLIMIT_REDIS_URL or
    scrapy-redis's REDIS_URL / REDIS_HOST / REDIS_PORT / REDIS_DB / REDIS_PARAMS; every
    call times out after ``timeout`` (ExitLimitConfig.redis_timeout; None: the setting's)."""
    params = dict(settings.getdict("REDIS_PARAMS"))
    params.pop("redis_cls", None)
    for name, arg in _SCRAPY_REDIS.items():
        if settings.get(name):
            params[arg] = settings.get(name)
    own = read_setting(settings, "EXITLIMIT_REDIS_URL")
    url = own or settings.get("REDIS_URL")
    source = ("EXITLIMIT_REDIS_URL" if own
              else "REDIS_URL" if url else "REDIS_HOST/REDIS_PORT" if params else "defaults")
    if timeout is None:
        timeout = read_setting(settings, "EXITLIMIT_REDIS_TIMEOUT")
    # a dead Redis must not stall admissions for scrapy-redis's 30 s default
    params["socket_timeout"] = params["socket_connect_timeout"] = timeout
    params.pop("retry_on_timeout", None)
    params.pop("encoding", None)
    params["decode_responses"] = True
    return url, params, source


def _safe_url(url: str | None, params: dict[str, Any]) -> str:
    if url:
        from ..core import mask_url

        return mask_url(url)
    return f"redis://{params.get('host', 'localhost')}:{params.get('port', 6379)}"


class RedisBackend(Backend):
    synchronous = False

    def __init__(self, config: ExitLimitConfig, settings: Any) -> None:
        self._offset = time.time() - time.monotonic()
        self._last_now = -math.inf
        super().__init__(config)
        # shared changes edit pair state directly: a failed scan may not stand
        self.limiter.narrow_rescans = False
        # a pair's next token may be taken by another process, which sees neither this
        # one's late timers nor its answers (and a reserved lease may go up to HELD_LATE
        # after its time): pairs keep the whole safety margin
        self.limiter.settled_margin = self.limiter.tuning.margin
        self.url, self.params, self.source = redis_settings(settings, config.redis_timeout)
        self.prefix = config.redis_prefix
        self.on_error = config.redis_on_error
        self.process_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.shared = True
        self.processes = 1
        #: live processes at the last heartbeat (this one included), and when each last
        #: renewed its presence (Redis time)
        self.members: tuple[str, ...] = ()
        self._renewed: dict[str, float] = {}
        #: while the pool is split (Redis lost, or back and not everyone rejoined yet):
        #: the members it was split between; and when this process rejoined
        self._partition: tuple[str, ...] | None = None
        self._rejoined_at = math.inf
        #: (lease key, token) of shared leases released while Redis was lost
        self._stale: list[tuple[str, str]] = []
        self._client: aioredis.Redis | aioredis.RedisCluster | None = None
        #: the URL names a Redis Cluster node (found at start): a cluster client is used
        self.cluster = False
        self._script: Any = None
        self._channel: ScriptChannel | None = None  # the lean path for script calls
        self._lua = resources.files(__package__).joinpath("exitlimit.lua").read_text()
        self._keys: dict[Any, tuple[str, ...]] = {}
        self._learn_seen: dict[str, str] = {}  # origin -> version this process knows
        self._marks: dict[str, tuple] = {}  # origin -> learning_mark at the last sync
        #: origins started warm whose stagger is not in the shared schedules yet
        self._stagger_due: set[str] = set()
        self._mark_checked: dict[str, float] = {}  # origin -> when it was last looked at
        self._publishing: set[str] = set()
        self._shared_leases: set[int] = set()
        #: lease releases not yet sent: they ride along with the next call
        self._releases: list[tuple[list[str], tuple[Any, ...]]] = []
        self._flush_timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task] = set()
        self._heartbeat: asyncio.Task | None = None
        self._reconnect: asyncio.Task | None = None
        self._closed = False
        #: answer a call that finds no token with a later one reserved (RESERVE_AHEAD)
        self.reserve = True
        #: when this process will next make an admission call, as far as it knows (a
        #: reserved token's time, or when an answer said to ask again): releases wait for it
        self._next_call = -math.inf
        #: origin -> leases reserved for later, by time (a call hands them out when due)
        self._held: dict[str, list[tuple[float, int, Lease]]] = {}
        #: origin -> while leases are held, when to call again for the pairs not reserved
        self._recall_at: dict[str, float] = {}
        #: large pools: origin -> the exits used last (most recent last) and their candidacy
        self._warm: dict[str, dict[str, Candidate]] = {}
        self._planned: dict[str, float] = {}  # origin -> when it was last planned
        #: origin -> when this process's last request under the origin's budget went
        self._shared_sent: dict[str, float] = {}
        #: where in a reservation window this process calls (processes told the same
        #: token's time would all call together); fixed, so a wake it names holds
        self._phase = random.random() * 0.8
        #: what was learned is kept this long after it was last written or used
        #: (EXITLIMIT_STATE_MAX_AGE): the next run starts from it
        self.learn_ttl = max(1, math.ceil(config.state_max_age))
        self._touched = -math.inf  # when the learned state of used origins was last kept
        #: learned scopes, as origins above: version seen, what was last published, when
        #: last looked at / read back / used
        self._scope_seen: dict[str, str] = {}
        self._scope_marks: dict[str, tuple] = {}
        self._scope_checked: dict[str, float] = {}
        self._scope_pulled: dict[str, float] = {}
        self._scope_used: dict[str, float] = {}
        self._scope_busy: set[str] = set()  # a read or an update in flight
        self.round_trips = 0
        self.calls: dict[str, int] = {}  # script calls by operation
        self.empty_admissions = 0  # admission calls that granted nothing
        self.held_late = 0  # reserved leases given back unused: asked for too late
        self.errors = 0

    @classmethod
    def from_crawler(cls, crawler: Crawler, config: ExitLimitConfig) -> RedisBackend:
        backend = cls(config, crawler.settings)
        backend.ping()
        return backend

    def describe(self) -> str:
        kind = "redis cluster" if self.cluster else "redis"
        return f"{kind} at {_safe_url(self.url, self.params)} (prefix {self.prefix})"

    # -- keys (all with the prefix as hash tag: one Cluster slot) ----------------
    def _key(self, kind: str, *parts: str) -> str:
        return f"{{{self.prefix}}}:{kind}:" + "|".join(parts)

    # -- clock: follows Redis TIME -------------------------------------------
    def clock(self) -> float:
        now = time.monotonic() + self._offset
        if now < self._last_now:  # never backwards, even when the offset is corrected
            return self._last_now
        self._last_now = now
        return now

    def _observe_time(self, redis_now: float, received: float) -> None:
        # Redis read its clock before the reply arrived: each reply gives a lower bound
        # of the offset, so this clock never runs ahead of Redis (timers never fire early)
        self._offset = max(self._offset, redis_now - received)

    # -- connection -------------------------------------------------------------
    def ping(self) -> None:
        """Blocking, once at start: fail the crawl early and clearly."""
        setting = self.source if self.source != "defaults" else "EXITLIMIT_REDIS_URL or REDIS_URL"
        try:
            client = (redis.Redis.from_url(self.url, **self.params) if self.url
                      else redis.Redis(**self.params))
            with client:
                seconds, micros = client.time()
                self._offset = seconds + micros / 1e6 - time.monotonic()
                # a Cluster node: the pool's keys live on whichever node serves their slot
                self.cluster = bool(client.info("cluster").get("cluster_enabled"))
        except (redis.RedisError, OSError, ValueError) as exc:
            raise RedisUnavailable(
                f"EXITLIMIT_BACKEND is redis but Redis at {_safe_url(self.url, self.params)} "
                f"(from {setting}) cannot be reached: {exc}") from None

    def _connect(self) -> None:
        """The asyncio client, created on the running loop."""
        if self._channel is not None:
            self._channel.close()
        if self.cluster:  # redis-py finds the node serving the pool's slot, and follows it
            params = {k: v for k, v in self.params.items() if k != "db"}
            self._client = (aioredis.RedisCluster.from_url(self.url, **params) if self.url
                            else aioredis.RedisCluster(**params))
            self._channel = None
        else:
            self._client = (aioredis.Redis.from_url(self.url, **self.params) if self.url
                            else aioredis.Redis(**self.params))
            self._channel = open_channel(self._client, self._lua)
        self._script = self._client.register_script(self._lua)

    async def _call(self, keys: list[str], args: list[Any]) -> Any:
        """One script call (one round trip)."""
        if self._client is None:
            self._connect()
        self.round_trips += 1
        self.calls[args[0]] = self.calls.get(args[0], 0) + 1
        if self._channel is not None:
            return await self._channel.call(keys, args)
        return await self._script(keys=keys, args=args)

    def _take_releases(self) -> tuple[list[str], list[Any]]:
        """The releases waiting to go out, as (KEYS, ARGV) tails for the script."""
        keys: list[str] = []
        args: list[Any] = []
        now = self.clock()
        for rkeys, (token, answered, at, slack, interval) in self._releases:
            keys += rkeys
            # anchored on when the answer came, not on when this call goes out
            args += [token, answered, repr(slack + max(0.0, now - at)), interval]
        self._releases = []
        return keys, args

    def _flush_releases(self) -> None:
        self._flush_timer = None
        if not self._releases or not self.shared:
            return
        now = self.clock()
        soon = self._next_call - now
        if 0 < soon <= RELEASE_WAIT and now - self._releases[0][1][2] < RELEASE_WAIT:
            # an admission call is due soon (a reserved token's time, or when the last
            # answer said to ask again): the releases ride along with it
            self._flush_timer = asyncio.get_running_loop().call_later(
                soon + RELEASE_DELAY, self._flush_releases)
            return
        keys, args = self._take_releases()
        self._spawn(self._shared_op(keys, ["release", *args]))

    def open(self) -> None:
        self._connect()
        self._heartbeat = asyncio.ensure_future(self._beat())  # the first one at once

    def close(self) -> Deferred | None:
        self._closed = True
        if self._flush_timer is not None:
            self._flush_timer.cancel()
        for task in (self._heartbeat, self._reconnect, *self._tasks):
            if task is not None:
                task.cancel()
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self._client is None:
            return None
        client, self._client = self._client, None
        return Deferred.fromFuture(asyncio.ensure_future(self._release_all(client)))

    async def _release_all(self, client: aioredis.Redis) -> None:
        """Leases still held at close go back now, not when they expire; what was learned
        for the origins used is kept EXITLIMIT_STATE_MAX_AGE from now."""
        try:
            if self.shared:
                await self._last_word(self._script)
            if self.shared:  # one call (the keys share a slot: a Cluster takes it too)
                keys, args = self._take_releases()
                for lease_id in list(self._shared_leases):
                    lease = self.limiter.leases.get(lease_id)
                    if lease is not None:
                        keys += [self._key("lease", lease.exit_id),
                                 self._key("pair", lease.origin, lease.pair or lease.exit_id)]
                        args += [self._token(lease_id), 0, 0, 0]
                await self._script(keys=[self._key("procs"), *keys],
                                   args=["leave", self.process_id, *args])
        except (redis.RedisError, OSError) as exc:
            logger.debug("exitlimit: could not hand leases back to Redis at close: %s", exc)
        finally:
            await client.aclose()

    async def _last_word(self, script: Any) -> None:
        """At close, what this process learned goes in once more (compare-and-set: a
        newer update by another process stands): its warm copy then carries the arrival
        jitter its pairs measured by the end, for processes started later; and what was
        learned for the origins used is kept EXITLIMIT_STATE_MAX_AGE from now."""
        used = [o for o, at in self._planned.items() if at > -math.inf]
        for origin in used:
            if origin in self.limiter.origins and origin in self._learn_seen:
                await script(keys=[self._key("learn", origin)],
                             args=["learn_put", self._learn_seen[origin],
                                   json.dumps(self._learning_blob(origin)), self.learn_ttl])
        for scope_id in self._scope_used:  # (a scope has no warm copy: only what changed)
            mark = self._scope_mark(scope_id)
            if scope_id in self._scope_seen and mark not in (None, self._scope_marks.get(scope_id)):
                await script(keys=[self._scope_key(scope_id)],
                             args=["learn_put", self._scope_seen[scope_id],
                                   json.dumps(self.limiter.scopes.export(scope_id)),
                                   self.learn_ttl])
        keys = [*(self._origin_keys(o)[1] for o in used),
                *(self._scope_key(scope_id) for scope_id in self._scope_used)]
        if keys:
            await script(keys=keys, args=["learn_touch", self.learn_ttl])

    def _learning_blob(self, origin: str) -> dict[str, Any]:
        """What is published for the origin: what this process learned (times on the
        Redis clock), and a copy as a state file keeps it (core/warm.py), which a process
        started later begins from."""
        data = self.limiter.export_learning(origin)
        warm = remember(self.limiter, time.time() - self.clock(), [origin]).get(origin)
        if warm is not None:
            data["warm"] = warm
        return data

    def _used_since(self, since: float) -> list[str]:
        """Learn keys of the origins and learned scopes this process admitted for since
        ``since``."""
        return [*(self._origin_keys(origin)[1] for origin, at in self._planned.items()
                  if at > since),
                *(self._scope_key(scope_id) for scope_id, at in self._scope_used.items()
                  if at > since)]

    def _keep_learned(self) -> None:
        """Every LEARN_TOUCH: what was learned for the origins in use stays while they are
        (a converged pool may go long without a change that writes it)."""
        now = self.clock()
        if now - self._touched < LEARN_TOUCH or not self.shared:
            return
        used = self._used_since(self._touched)
        self._touched = now
        if used:
            self._spawn(self._shared_op(used, ["learn_touch", self.learn_ttl]))
        self._forget_scopes()

    def _forget_scopes(self) -> None:
        """Scopes the limiter forgot (idle: ``ScopeTable.forget_idle``) leave this
        backend's books too: scope names can be many, and each met again is read afresh."""
        states = self.limiter.scopes.states
        for scope_id in [k for k in self._scope_used if k not in states]:
            for book in (self._scope_seen, self._scope_marks, self._scope_checked,
                         self._scope_pulled, self._scope_used):
                book.pop(scope_id, None)

    def recalled(self, origins: list[str]) -> None:
        """What EXITLIMIT_STATE_FILE held goes into Redis where Redis has nothing for the
        origin (compare-and-set from version 0: a Redis that has it keeps its own, and
        this process adopts that)."""
        for origin in origins:
            self._learn_seen[origin] = "0"
            self._marks.pop(origin, None)
            self._stagger_due.add(origin)
            self._sync_learning(origin, urgent=True)

    def _token(self, lease_id: int) -> str:
        return f"{self.process_id}:{lease_id}"

    # -- trouble --------------------------------------------------------------
    def _lost(self, exc: BaseException) -> None:
        self.errors += 1
        if not self.shared or self._closed:
            return
        self.shared = False
        # releases not sent: their places are taken out of Redis when it is back
        self._stale += [(rkeys[0], args[0]) for rkeys, args in self._releases]
        self._releases.clear()
        if self.on_error == "pause":
            logger.warning("exitlimit: Redis lost (%s): admissions paused while reconnecting "
                           "(EXITLIMIT_REDIS_ON_ERROR=pause)", exc)
        elif self.process_id in self.members:
            self._take_partition(exc)
        else:  # lost before this process saw who else is there
            self.limiter.share = 1.0 / max(self.processes, 1)
            logger.warning("exitlimit: Redis lost (%s) before the member list was seen: "
                           "continuing on local state at 1/%d of each pair's rate while "
                           "reconnecting", exc, self.processes)
        self._reconnect = asyncio.ensure_future(self._reconnect_loop())

    def _take_partition(self, exc: BaseException) -> None:
        """Split the exits with the processes the last heartbeat showed: this one uses
        only its share, each exit at its full rate, so no two processes meet on one."""
        members = self.members
        mine = share(self.limiter.exits, members, self.process_id)
        self._partition = members
        self.limiter.share = 1.0
        self.limiter.restrict(mine)
        # another process may have just used one of these, or holds a token reserved on
        # one (up to RESERVE_AHEAD on): that long before each goes
        now = self.clock()
        for origin in self.limiter.origins:
            for exit_id in mine:
                bucket = self.limiter.pair_state(origin, exit_id).bucket
                bucket.hold_until(now + max(bucket.interval, RESERVE_AHEAD))
        logger.warning("exitlimit: Redis lost (%s): partition taken: this process uses %d of "
                       "%d exits (rendezvous hash over %d processes) at their full rate while "
                       "reconnecting", exc, len(mine), len(self.limiter.exits), len(members))

    def _give_back_partition(self, why: str) -> None:
        if self._partition is None:
            return
        self._partition = None
        self._rejoined_at = math.inf
        self.limiter.restrict(None)
        logger.warning("exitlimit: partition given back (%s): every exit shared again", why)

    def _check_handover(self, now: float) -> None:
        """Back from an outage: the partition stays until everyone it was split with has
        renewed since this process rejoined (or HANDOVER has passed)."""
        if self._partition is None or not self.shared:
            return
        waiting = [m for m in self._partition if m != self.process_id
                   and self._renewed.get(m, -math.inf) < self._rejoined_at]
        if not waiting:
            self._give_back_partition(f"all {len(self._partition)} processes rejoined")
        elif now - self._rejoined_at >= HANDOVER:
            self._give_back_partition(f"{len(waiting)} of {len(self._partition)} processes "
                                      f"not back after {HANDOVER:g} s")

    async def _reconnect_loop(self) -> None:
        attempt = 0
        while not self._closed:
            await asyncio.sleep(RECONNECT_BACKOFF[min(attempt, len(RECONNECT_BACKOFF) - 1)])
            attempt += 1
            try:
                if self._client is not None:
                    await self._client.aclose()
                self._connect()
                await self._rejoin()
            except (redis.RedisError, OSError) as exc:
                logger.debug("exitlimit: Redis still unreachable (%s)", exc)
                continue
            logger.warning("exitlimit: Redis is back after %d attempt(s): shared state resumed%s",
                           attempt, "; keeping to this process's share of the exits until the "
                           "others rejoin" if self._partition is not None else "")
            self._check_handover(self._rejoined_at)
            return

    async def _rejoin(self) -> None:
        """One call: leases in flight registered again, those released meanwhile taken out,
        this process's pair schedules, holds and bans seeded (the later wins), presence
        renewed; then what it learned is published where Redis has nothing newer."""
        limiter, now = self.limiter, self.clock()
        leases = list(limiter.leases.values())
        stale = self._stale
        pkeys: list[str] = []
        pargs: list[Any] = []
        for origin, origin_state in limiter.origins.items():
            for pair_key, pair in origin_state.pairs.items():
                bucket = pair.bucket
                if max(bucket.tat, pair.cooldown_until, pair.banned_until) <= now:
                    continue  # nothing to say: the pair is free as far as this process knows
                pkeys.append(self._key("pair", origin, pair_key))
                pargs += [_f(bucket.tat), repr(bucket.tolerance), _f(pair.cooldown_until),
                          _f(pair.banned_until)]
        origins = list(limiter.origins)
        keys = [self._key("procs"), *(self._key("lease", lease.exit_id) for lease in leases),
                *(key for key, _ in stale), *pkeys,
                *(self._origin_keys(origin)[1] for origin in origins)]
        args = ["rejoin", self.process_id, LEASE_TTL, len(leases), len(stale), len(pkeys),
                *(self._token(lease.id) for lease in leases), *(token for _, token in stale),
                *pargs]
        reply = await self._call(keys, args)
        self._observe_time(float(reply[0]), time.monotonic())
        versions = reply[2 + 2 * int(reply[1]):]
        self._saw_members(reply[:2 + 2 * int(reply[1])])
        self._stale = []
        self._shared_leases = {lease.id for lease in leases}
        self._rejoined_at = float(reply[0])
        self.shared = True
        self.limiter.share = 1.0
        loop = asyncio.get_running_loop()
        for origin, version in zip(origins, versions, strict=True):
            if str(version) == "0":  # a restarted, empty Redis: what this process knows
                self._learn_seen[origin] = "0"
                if self.limiter.learning_mark(origin) == self._marks.get(origin):
                    # nothing learned while away: a process that did goes first
                    loop.call_later(SEED_DELAY, self._seed, origin)
                    continue
                self._marks.pop(origin, None)
            elif str(version) != self._learn_seen.get(origin):
                self._spawn(self._pull_learning(origin, str(version)))
                continue
            self._sync_learning(origin, urgent=True)

    def _seed(self, origin: str) -> None:
        """Redis came back empty and nobody put in what the pool had learned: this
        process's copy goes in (compare-and-set: if someone was first, theirs stands)."""
        if self.shared and self._learn_seen.get(origin) == "0" and origin in self.limiter.origins:
            self._marks.pop(origin, None)
            self._sync_learning(origin, urgent=True)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _shared_op(self, keys: list[str], args: list[Any]) -> Any:
        """A fire-and-forget update of shared state; trouble switches to local state."""
        if not self.shared:
            return None
        try:
            return await self._call(keys, args)
        except (redis.RedisError, OSError) as exc:
            self._lost(exc)
            return None

    async def _beat(self) -> None:
        """Renew this process's leases and presence; see who shares the pool."""
        while not self._closed:
            if self.shared:
                keys, tokens = [self._key("procs")], []
                for lease_id in self._shared_leases:
                    lease = self.limiter.leases.get(lease_id)
                    if lease is not None:
                        keys.append(self._key("lease", lease.exit_id))
                        tokens.append(self._token(lease_id))
                reply = await self._shared_op(keys, ["renew", self.process_id, LEASE_TTL,
                                                     *tokens])
                if reply is not None:
                    self._saw_members(reply)
                    self._check_handover(float(reply[0]))
                self._keep_learned()
            self._drop_late_held()
            await asyncio.sleep(HEARTBEAT)

    def _saw_members(self, reply: list[Any]) -> None:
        """A presence reply: now, count, then (process id, when it last renewed) each."""
        flat = reply[2:]
        self._renewed = {str(m): float(at) for m, at in zip(flat[::2], flat[1::2],
                                                             strict=True)}
        self.members = tuple(sorted(self._renewed))
        self.processes = max(len(self.members), 1)

    # -- admission ------------------------------------------------------------
    def admit(self, origin: str, want: int, now: float, pinned: str | None = None,
              scopes: Sequence[Scope] = ()) -> asyncio.Future:
        return asyncio.ensure_future(self._admit_and_poll(origin, want, pinned, tuple(scopes)))

    async def _admit_and_poll(self, origin: str, want: int, pinned: str | None,
                              scopes: tuple[Scope, ...] = ()) -> Admission:
        admission = await self._admit(origin, want, pinned, scopes)
        if admission.leases or self._partition is None:
            return admission
        # while the pool is split, ask again soon whatever the answer: the split ends
        # without a release to wake the queue, and a pinned exit may be held elsewhere
        return Admission([], min(admission.ready_at, self.clock() + PARTITION_POLL),
                         admission.release_helps)

    async def _admit(self, origin: str, want: int, pinned: str | None,
                     scopes: tuple[Scope, ...] = ()) -> Admission:
        """Leases from the shared state. ``scopes``: named budgets each request also needs,
        taken in the same call (no token of theirs is reserved ahead of time: a reserved
        lease is an unscoped request's)."""
        if not self.shared:
            return self._admit_locally(origin, want, pinned, scopes)
        limiter = self.limiter
        now = self.clock()
        if origin not in limiter.origins:  # new, or forgotten while idle: learn it afresh
            self._learn_seen.pop(origin, None)
            self._marks.pop(origin, None)
            self._mark_checked.pop(origin, None)
            self._shared_sent.pop(origin, None)
            self._recall_at.pop(origin, None)
        if origin not in self._learn_seen:  # first met: start from what Redis holds
            await self._pull_learning(origin, "")
            if not self.shared:
                return self._admit_locally(origin, want, pinned, scopes)
        if origin in self._stagger_due:
            await self._stagger(origin)
        for scope in scopes:
            if scope.rate is None:  # learned: what the other processes learned first
                await self._follow_scope(scope)
        if pinned is None and not scopes and origin in self._held:
            held = self._from_held(origin, now)
            recall = self._recall_at.get(origin, math.inf)
            if held.leases or now < recall:
                return held._replace(ready_at=min(held.ready_at, recall))
            # a pair the reserving call passed over is due before the reserved tokens: ask
            # for it, those still held
        admission = await self._call_admit(origin, want, pinned, scopes, now)
        held_leases = self._held.get(origin)
        if not held_leases:
            return admission
        # holding reserved leases: Redis is called again at the call's ready_at (for the
        # pairs not reserved), the parking lot woken for the first reserved one too
        self._recall_at[origin] = admission.ready_at
        return admission._replace(ready_at=min(admission.ready_at, held_leases[0][0]))

    async def _call_admit(self, origin: str, want: int, pinned: str | None,
                          scopes: tuple[Scope, ...], now: float) -> Admission:
        """The admission call itself (after what needs none: a warm start's stagger, the
        leases reserved before)."""
        limiter = self.limiter
        # this process's first request under a shared budget goes alone, and the next
        # waits for its answer (``ArrivalFloor.gate``: its own cold connections)
        gate, first = limiter.first_answer_gate(origin, scopes, now)
        if gate is not None:
            return Admission([], gate)
        if first:
            want = 1
        wake = self._shared_wake(origin, now, pinned is None and not scopes and self.reserve)
        if wake is not None:
            self._next_call = wake
            return Admission([], wake, False)
        # the best few first (what this process knows of their load; in a large pool the
        # exits it used last, alone, with no plan made while they serve: the pool's other
        # exits are not even looked at); the rest only when those could not grant
        # everything asked for: fewer keys to send and check
        first = FIRST_CANDIDATES + want
        best = (self._warm_ready(origin, now)[:first]
                if pinned is None and origin in self._warm else [])
        candidates: list[Candidate] = []
        earliest, planned = math.inf, not best
        if planned:
            candidates, earliest = limiter.plan(origin, now, MAX_CANDIDATES, pinned)
            if not candidates:
                return Admission([], earliest)
            best, candidates = candidates[:first], candidates[first:]
            self._planned[origin] = now
        elif now - self._planned.get(origin, -math.inf) >= 1.0:
            limiter.plan(origin, now, 1)  # its time-driven upkeep (learning ages, scouts)
            self._planned[origin] = now
        leases: list[Lease] = []
        reserved: list[tuple[float, int, Lease]] = []
        wait, lease_blocked, shared_blocked = math.inf, False, False
        for chunk in (best, None):
            if len(leases) + len(reserved) >= want:
                break
            if chunk is None:  # the rest
                if not planned:
                    taken = {c.exit_id for c in best}
                    candidates, earliest = limiter.plan(origin, now, MAX_CANDIDATES, pinned)
                    candidates = [c for c in candidates if c.exit_id not in taken]
                    self._planned[origin] = now
                chunk = candidates
            if not chunk:
                continue
            try:
                granted, chunk_wait, blocked, shared_blocked = await self._admit_on(
                    origin, want - len(leases) - len(reserved), chunk,
                    pinned is None and not scopes, scopes)
            except (redis.RedisError, OSError) as exc:
                self._lost(exc)
                return self._admit_locally(origin, want, pinned, scopes)
            for at, lease in granted:
                if at:
                    reserved.append((at, lease.id, lease))
                else:
                    leases.append(lease)
            lease_blocked = lease_blocked or blocked
            if shared_blocked:
                # a shared budget's token (the origin's, a scope's) held up a ready
                # candidate: nothing goes before it, and the rest of the candidates would
                # wait for the same token (not worth a call)
                wait = chunk_wait
                break
            wait = min(wait, chunk_wait)
            if reserved:
                break
        self._sync_learning(origin)
        self._sent(leases)
        if reserved:  # tokens reserved for later: each request goes at its token's time
            held = self._held[origin] = sorted([*self._held.get(origin, ()), *reserved])
            # (the script's wait is then when a pair it passed over is due: ask again then)
            self._next_call = min(wait, held[-1][0])
            return Admission(leases, wait, False)
        if lease_blocked:
            wait = min(wait, self.clock() + LEASE_POLL)
        # a pair waiting for its first answer (single file) is woken by that answer
        release_helps = lease_blocked or self._single_file(origin)
        # a shared budget's token held up a ready pair: nothing goes before it, whatever
        # this process's plan says of the pairs
        ready_at = wait if shared_blocked else min(wait, earliest)
        self._next_call = self.clock() if leases else ready_at
        return Admission(leases, ready_at, release_helps)

    def _shared_wake(self, origin: str, now: float, reserving: bool) -> float | None:
        """When to call for the origin's budget's next token, if not now: no request can
        go before an interval after this process's last one (other processes only take
        more tokens), and no call can get it before it may be reserved (RESERVE_AHEAD, and
        half an interval, as the script keeps to). Saves a call that would find nothing."""
        sent = self._shared_sent.get(origin)
        bucket = self.limiter.origin_state(origin).budget.bucket
        if sent is None or bucket is None:
            return None
        interval = self._origin_interval(bucket)  # what the script paces it at
        lead = 0.0
        if reserving:  # at a phase of its own within the window, as the script's `opens`
            lead = min(RESERVE_AHEAD, interval / 2) * (1 - self._phase)
        wake = sent + interval - bucket.tolerance - lead
        return wake if wake > now else None

    def _single_file(self, origin: str) -> bool:
        """Whether a pair of this origin waits for its first answer (which wakes the
        queue): through this process's leases or the origin's pairs, whichever is fewer."""
        pairs = self.limiter.origin_state(origin).pairs
        leases = self.limiter.leases
        if len(leases) < len(pairs):
            return any(pair.single_file for lease in leases.values()
                       if lease.origin == origin
                       and (pair := pairs.get(lease.pair or lease.exit_id)) is not None)
        return any(pair.single_file for pair in pairs.values())

    def _warm_ready(self, origin: str, now: float) -> list[Candidate]:
        """A large pool: the exits this process used last and knows ready, most recent
        first. They are tried alone first (open connections, proven pairs); the plan's,
        looked at round robin, only after."""
        limiter = self.limiter
        pairs = limiter.origin_state(origin).pairs
        warm = []
        for exit_id, c in reversed(self._warm[origin].items()):
            exit_state = limiter.exits[exit_id]
            pair = pairs.get(c.pair)
            # only what this process knows ready, or soon enough to be reserved (others
            # would cost a second call)
            if (pair is None or pair.single_file or exit_state.in_flight >= exit_state.limit
                    or exit_state.health.dead(now)
                    or pair.ready_at(now) > now + pair.bucket.interval / 2
                    or (limiter.allowed is not None and exit_id not in limiter.allowed)):
                continue
            warm.append(c)
        return warm

    def _used(self, origin: str, c: Candidate) -> None:
        """Remember an exit this process was granted (large pools: see _warm_first)."""
        if len(self.limiter.exits) <= INDEX_ABOVE:
            return
        warm = self._warm.setdefault(origin, {})
        warm.pop(c.exit_id, None)
        warm[c.exit_id] = c
        if len(warm) > WARM_KEEP:
            del warm[next(iter(warm))]

    def _from_held(self, origin: str, now: float) -> Admission:
        """Leases reserved by an earlier call whose time has come; no call to Redis."""
        held = self._held[origin]
        due = []
        while held and held[0][0] <= now:
            at, lease_id, lease = held.pop(0)
            if now - at > HELD_LATE and not self._may_go_late(lease, held):
                # sent this late it could land on the next token
                self.held_late += 1
                self.release(lease_id, answered=False)
            else:
                due.append(lease)
        if not held:
            del self._held[origin]
        self._sent(due, pairs_too=True)
        return Admission(due, now if due or not held else held[0][0], False)

    def _may_go_late(self, lease: Lease, held: list[tuple[float, int, Lease]]) -> bool:
        """Whether a reserved lease whose time passed may still go (its pair re-anchored on
        when it does): only when no other process can hold its pair's next token, and this
        one holds none. A pause of this process's own (a garbage collection of 50-70 ms
        every ~4 s on nginx) otherwise cost every exit due in it a whole interval."""
        return self.processes <= 1 and not any(
            other.exit_id == lease.exit_id for _, _, other in held)

    def _drop_late_held(self) -> None:
        """Reserved leases nobody asked for in time (their requests went away) go back
        (a lone process gives a pause of its own RESERVE_AHEAD: ``_may_go_late``)."""
        now = self.clock()
        late = HELD_LATE if self.processes > 1 else max(HELD_LATE, RESERVE_AHEAD)
        for origin in list(self._held):
            held = self._held[origin]
            while held and now - held[0][0] > late:
                self.held_late += 1
                self.release(held.pop(0)[1], answered=False)
            if not held:
                del self._held[origin]

    async def _admit_on(self, origin: str, want: int, candidates: list[Candidate],
                        reserve: bool, scopes: tuple[Scope, ...] = ()
                        ) -> tuple[list[tuple[float, Lease]], float, bool, bool]:
        """One admission call on these candidates: ((when it may go: 0 now, else its
        reserved token's time; lease) each, when to ask again, whether a lease limit
        stood in the way, whether a shared budget (the origin's, a scope's) did while a
        candidate was ready). ``reserve``: tokens due soon may be reserved. ``scopes``: the
        named budgets each lease also takes, at the rates this process paces them at
        (configured, or learned: synced first), with the origin's."""
        limiter = self.limiter
        budget = limiter.origin_state(origin).budget.bucket
        # the releases waiting to go out ride along, applied first
        rkeys, rargs = self._take_releases()
        keys = [*self._origin_keys(origin), *rkeys]
        # lease ids are this process's own; the script names leases with them
        first_id = limiter.reserve_lease_ids(want)
        args: list[Any] = ["admit", want, self.process_id, first_id, LEASE_TTL,
                           self._origin_interval(budget) if budget is not None else 0,
                           budget.tolerance if budget is not None else 0, len(rkeys) // 2,
                           RESERVE_AHEAD if self.reserve and reserve else 0,
                           # callers of a window apart: decorrelated anew every call
                           f"{random.random() * 0.8:.3f}", *rargs]
        pairs = limiter.origin_state(origin).pairs
        for c in candidates:
            keys += self._candidate_keys(origin, c)
            pair = pairs.get(c.pair)
            warm = pair is not None and limiter.arrival_slack(pair) > 0
            args += [repr(c.interval), repr(c.tolerance), c.limit, 1 if warm else 0]
        if scopes:  # after the candidates (a learned scope not limited yet has no budget)
            for scope_key, bucket in limiter.scope_budgets(scopes):
                keys.append(self._key("scope", scope_key))
                args += [repr(bucket.interval), repr(bucket.tolerance)]
        reply = await self._call(keys, args)
        received = time.monotonic()
        redis_now, wait, blocked, version = (float(reply[0]), float(reply[1]),
                                             int(reply[2]), str(reply[3]))
        self._observe_time(redis_now, received)
        if len(reply) == 4:
            self.empty_admissions += 1
        leases = []
        for i, (index, gap, site_gap, at) in enumerate(zip(
                reply[4::4], reply[5::4], reply[6::4], reply[7::4], strict=True)):
            at = float(at)
            c = candidates[int(index) - 1]
            self._used(origin, c)
            # the gaps since the pair's and the origin's previous admissions, whichever
            # process made them (the script's "never admitted" is -1e18: a first one)
            gap, site_gap = (g if g < 1e17 else math.inf for g in (float(gap), float(site_gap)))
            lease = limiter.grant(origin, c.exit_id, at or redis_now, gap,
                                  lease_id=first_id + i, scopes=scopes, site_gap=site_gap)
            self._shared_leases.add(lease.id)
            leases.append((at, lease))
        if version != self._learn_seen.get(origin):
            await self._pull_learning(origin, version)
        return leases, wait, bool(blocked & 1), bool(blocked & 2)

    def _origin_keys(self, origin: str) -> tuple[str, str]:
        keys = self._keys.get(origin)
        if keys is None:
            keys = self._keys[origin] = (self._key("origin", origin), self._key("learn", origin))
        return keys

    def _candidate_keys(self, origin: str, c: Candidate) -> tuple[str, str, str]:
        cache_key = (origin, c.pair, c.exit_id)
        keys = self._keys.get(cache_key)
        if keys is None:
            if len(self._keys) > KEY_CACHE:
                self._keys.clear()
            keys = self._keys[cache_key] = (self._key("pair", origin, c.pair),
                                            self._key("lease", c.exit_id),
                                            self._key("exit", c.exit_id))
        return keys

    def _admit_locally(self, origin: str, want: int, pinned: str | None,
                       scopes: Sequence[Scope] = ()) -> Admission:
        now = self.clock()
        if self.on_error == "pause":
            return Admission([], now + LEASE_POLL * 10)
        return self.admit_here(origin, want, now, pinned, scopes)

    # -- learned state ------------------------------------------------------------
    async def _pull_learning(self, origin: str, version: str) -> None:
        try:
            got_version, blob = await self._call([self._key("learn", origin)], ["learn_get"])
        except (redis.RedisError, OSError) as exc:
            self._lost(exc)
            return
        if str(got_version) != "0" and str(got_version) == self._learn_seen.get(origin):
            return  # adopted already (two pulls at once), or this process's own
        self._adopt(origin, str(got_version), blob)

    def _adopt(self, origin: str, version: str, blob: str) -> None:
        self._learn_seen[origin] = version
        if not blob:  # nothing there (a restarted Redis): what this process knows goes in
            self._marks.pop(origin, None)
            return
        data = json.loads(blob)
        if not self._warm_start(origin, data):
            self.limiter.import_learning(origin, data)
        self._marks[origin] = self.limiter.learning_mark(origin)

    async def _stagger(self, origin: str) -> None:
        """A warm start's stagger (core/warm.py) into the shared pair schedules, before
        the first admission: held until each pair's first turn (the later deadline wins,
        so processes starting together do not undo each other's)."""
        self._stagger_due.discard(origin)
        now, ops = self.clock(), []
        ostate = self.limiter.origins.get(origin)
        for exit_id, pair in (ostate.pairs.items() if ostate is not None else ()):
            ready = pair.bucket.ready_at(now)
            if ready > now and exit_id in self.limiter.exits:
                ops.append(self._shared_op([self._key("pair", origin, exit_id)],
                                           ["hold", "cool", repr(ready - now),
                                            repr(pair.bucket.tolerance)]))
        await asyncio.gather(*ops)

    def _warm_start(self, origin: str, data: dict[str, Any]) -> bool:
        """A process new to the origin (none of its pairs has answered enough to know its
        arrival jitter) starts from the blob's ``warm`` copy, as from a state file: the
        pace that ran clean, with the jitter allowance of the pairs that learned it
        folded in (its own pairs do not allow for any yet; core/warm.py)."""
        warm = data.get("warm")
        ostate = self.limiter.origins.get(origin)
        if warm is None or ostate is not None and any(
                self.limiter.arrival_slack(pair) > 0 for pair in ostate.pairs.values()):
            return False
        try:
            got = recall(self.limiter, parse_origins({origin: warm}), wall_now=time.time(),
                         max_age=self.config.state_max_age)
        except StateFileError as exc:
            logger.warning("exitlimit: what Redis holds for %s cannot be used: %s", origin, exc)
            return False
        if got.origins:
            self._stagger_due.add(origin)
        return bool(got.origins)

    def _sync_learning(self, origin: str, urgent: bool = False) -> None:
        """Publish what this process learned since it last synced (one update in flight)."""
        if not self.shared or origin in self._publishing:
            return
        now = self.clock()
        state = self.limiter.origins.get(origin)
        every = LEARN_CHECK * max(1.0, len(state.pairs) / LEARN_CHECK_PAIRS) if state else 0
        if not urgent and now - self._mark_checked.get(origin, -math.inf) < every:
            return
        self._mark_checked[origin] = now
        mark = self.limiter.learning_mark(origin)
        if mark == self._marks.get(origin):
            return
        self._publishing.add(origin)
        self._spawn(self._publish(origin, mark))

    async def _put_learned(self, key: str, base: str, data: Any
                           ) -> tuple[bool, str, str] | None:
        """Compare-and-set of a learn blob made from version ``base``: (stored, the
        version now, what is there when not stored); None when Redis is not reachable."""
        reply = await self._shared_op([key], ["learn_put", base, json.dumps(data),
                                              self.learn_ttl])
        return None if reply is None else (bool(int(reply[0])), str(reply[1]), reply[2])

    async def _publish(self, origin: str, mark: tuple) -> None:
        try:
            put = await self._put_learned(self._key("learn", origin),
                                          self._learn_seen.get(origin, "0"),
                                          self._learning_blob(origin))
            if put is None:
                return
            ok, version, current = put
            if ok:
                self._learn_seen[origin] = version
                self._marks[origin] = mark
            else:  # someone else updated it first: theirs stands, ours is dropped
                self._adopt(origin, version, current)
        finally:
            self._publishing.discard(origin)
        self._sync_learning(origin, urgent=True)  # what it learned meanwhile, if anything

    # -- learned scopes (an account's, an API key's rate) ---------------------------
    # Shared as an origin's learning is, in a versioned blob of its own (compare-and-set
    # on update), read back every SCOPE_PULL while the scope is in use.
    def _scope_key(self, scope_id: str) -> str:
        return self._key("learn-scope", scope_id)

    async def _follow_scope(self, scope: Scope) -> None:
        """Before a learned scope's first admission here, what Redis holds for it; then,
        at each admission, what this process learned goes out, and what the others did is
        read back every SCOPE_PULL (in the background), while the scope is in use."""
        self.limiter.scopes.state(scope)  # made here first (a warm start's rate, if any)
        now = self.clock()
        self._scope_used[scope.id] = now
        if scope.id not in self._scope_seen:
            await self._pull_scope(scope.id)
            return
        self._sync_scope(scope.id)  # what this process learned since, if anything, first
        if (now - self._scope_pulled.get(scope.id, -math.inf) >= SCOPE_PULL
                and scope.id not in self._scope_busy):
            self._scope_busy.add(scope.id)
            self._spawn(self._pull_scope(scope.id))

    async def _pull_scope(self, scope_id: str) -> None:
        self._scope_pulled[scope_id] = self.clock()
        try:
            got = await self._shared_op([self._scope_key(scope_id)], ["learn_get"])
        finally:
            self._scope_busy.discard(scope_id)
        if got is None:
            return
        version, blob = str(got[0]), got[1]
        if version == self._scope_seen.get(scope_id):
            return  # nothing new (or this process's own update)
        self._adopt_scope(scope_id, version, blob)

    def _adopt_scope(self, scope_id: str, version: str, blob: str) -> None:
        self._scope_seen[scope_id] = version
        if not blob:  # nothing there: what this process knows (a warm start's) goes in
            self._scope_marks.pop(scope_id, None)
            self._sync_scope(scope_id, urgent=True)
            return
        self.limiter.scopes.adopt(scope_id, json.loads(blob))
        mark = self._scope_mark(scope_id)
        if mark is not None:
            self._scope_marks[scope_id] = mark

    def _scope_mark(self, scope_id: str) -> tuple | None:
        learner = self.limiter.scopes.learned(scope_id)
        return None if learner is None else learner.rate_mark()

    def _sync_scope(self, scope_id: str, urgent: bool = False) -> None:
        """Publish what this process learned of the scope since it last did."""
        if not self.shared or scope_id in self._scope_busy or scope_id not in self._scope_seen:
            return
        now = self.clock()
        if not urgent and now - self._scope_checked.get(scope_id, -math.inf) < LEARN_CHECK:
            return
        self._scope_checked[scope_id] = now
        mark = self._scope_mark(scope_id)
        if mark is None or mark == self._scope_marks.get(scope_id):
            return
        self._scope_busy.add(scope_id)
        self._spawn(self._publish_scope(scope_id, mark))

    async def _publish_scope(self, scope_id: str, mark: tuple) -> None:
        try:
            put = await self._put_learned(self._scope_key(scope_id),
                                          self._scope_seen.get(scope_id, "0"),
                                          self.limiter.scopes.export(scope_id))
        finally:
            self._scope_busy.discard(scope_id)
        if put is None:
            return
        ok, version, current = put
        if ok:
            self._scope_seen[scope_id] = version
            self._scope_marks[scope_id] = mark
        else:  # another process updated it first: theirs stands
            self._adopt_scope(scope_id, version, current)

    # -- feedback ----------------------------------------------------------------
    def release(self, lease_id: int, answered: bool = True) -> Lease | None:
        lease = self.limiter.release(lease_id, answered)
        if lease is not None and lease_id in self._shared_leases and not self.shared:
            self._shared_leases.discard(lease_id)  # Redis lost: taken out when it is back
            self._stale.append((self._key("lease", lease.exit_id), self._token(lease_id)))
        elif lease is not None and lease_id in self._shared_leases:
            self._shared_leases.discard(lease_id)
            pair = self.limiter.pair_state(lease.origin, lease.exit_id)
            lease_key, token, now = self._key("lease", lease.exit_id), self._token(lease_id), \
                self.clock()
            slack = self.limiter.arrival_slack(pair)
            # 2: answered on a cold path (no slack known), as late as its answer
            arrived = 0 if not answered else 1 if slack else 2
            self._releases.append(([lease_key, self._pair_hash(lease)],
                                   (token, arrived, now, slack, repr(pair.bucket.interval))))
            if answered:
                # the origin budget's and each scope's next token an interval after the
                # request surely arrived (``bucket.ArrivalFloor``): a release of the same
                # token (given back already) re-anchors their hashes as a pair's
                for key, arrivals, interval in self._shared_budgets(lease):
                    self._releases.append(([lease_key, key], (
                        token, 1, now, arrivals.slack, repr(interval))))
            self._arm_flush()
        return lease

    def _pair_hash(self, lease: Lease) -> str:
        """The Redis key of the pair a lease was granted on."""
        return self._key("pair", lease.origin, self.limiter.pair_key(lease.exit_id))

    def _shared_budgets(self, lease: Lease) -> list[tuple[str, ArrivalFloor, float]]:
        """The budgets every exit shares that ``lease`` took a token from (the origin's,
        each named scope's), as (Redis key, arrival floor, interval the script paces)."""
        budget = self.limiter.origin_state(lease.origin).budget
        shared = []
        if budget.bucket is not None:
            shared.append((self._key("origin", lease.origin), budget.arrivals,
                           self._origin_interval(budget.bucket)))
        for scope in lease.scopes:
            state = self.limiter.scopes.states.get(scope.id)
            if state is not None and state.bucket is not None:
                shared.append((self._key("scope", scope.id), state.arrivals,
                               state.bucket.interval))
        return shared

    def _origin_interval(self, bucket: TokenBucket) -> float:
        """The origin budget's interval as the script paces it. With several processes
        taking its tokens, none sees when the others' requests go (a late timer, a
        reply's way back), so a configured site rate, exact in one process (a late
        request moves the next token: ``_sent``), gets EXITLIMIT_SAFETY_MARGIN as a
        learned one has (three processes at a configured 20 r/s in the lab: 0.68-0.75
        of the site's rate at 1.2-2.1 % of 429s without it, 0.92 at 0.17 % with it)."""
        if self.processes > 1:
            return bucket.interval + max(0.0, self.limiter.tuning.margin - bucket.margin)
        return bucket.interval

    def _sent(self, leases: list[Lease], pairs_too: bool = False) -> None:
        """Leases handed out after their token's time (a reserved one when its timer fired
        late, a granted one after the reply's way back): the shared budgets they took from
        take their next token an interval after the request actually goes. Stamped at the
        token's time, a late request would crowd the next one, which a strict site counts
        from arrival to arrival (the memory backend stamps when the request goes).
        ``pairs_too``: reserved leases, whose pairs are re-anchored as well when one goes
        more than HELD_LATE after its time (``_may_go_late``)."""
        now = self.clock()
        anchors = []
        for lease in leases:
            if self.limiter.origin_state(lease.origin).budget.bucket is not None:
                self._shared_sent[lease.origin] = now
            if now - lease.admitted_at < SENT_LATE:
                continue
            budgets = [(key, interval) for key, _, interval in self._shared_budgets(lease)]
            if pairs_too and now - lease.admitted_at > HELD_LATE:
                pair = self.limiter.pair_state(lease.origin, lease.exit_id)
                budgets.append((self._pair_hash(lease), pair.bucket.interval))
            for key, interval in budgets:
                # an empty token: nothing given back, the budget's hash re-anchored alone
                anchors.append(([key, key], ("", 1, now, 0.0, repr(interval))))
        if anchors:
            self._releases += anchors
            self._arm_flush()

    def _arm_flush(self) -> None:
        if self._flush_timer is None:
            self._flush_timer = asyncio.get_running_loop().call_later(
                RELEASE_DELAY, self._flush_releases)

    def _replicate(self, origin: str, feedback: Feedback) -> list[Event]:
        """Copy what feedback changed into shared state (holds, bans, evictions); publish
        what the origin learned (at once when it changed, else at the next look)."""
        if not self.shared:
            return feedback.events
        for change in feedback.changes:
            if isinstance(change, PairHeld):
                self._hold(self._key("pair", change.origin, change.pair), HOLD_FIELDS[change.hold],
                           change.until, change.tolerance)
            elif isinstance(change, OriginHeld):
                self._hold(self._key("origin", change.origin), "hold", change.until,
                           change.tolerance)
            elif isinstance(change, ExitEvicted):
                seconds = change.until - self.clock()
                self._spawn(self._shared_op([self._key("exit", change.exit_id)],
                                            ["dead", repr(max(seconds, 0.0))]))
        if origin:
            self._sync_learning(origin, urgent=feedback.learned())
        return feedback.events

    def _hold(self, key: str, field: str, until: float, tolerance: float) -> None:
        """No request on a pair (or origin) before ``until``, then one (not a burst)."""
        seconds = until - self.clock()
        if seconds <= 0:
            return
        self._spawn(self._shared_op([key], ["hold", field, repr(seconds), repr(tolerance)]))

    def stats(self) -> dict[str, Any]:
        return {"redis_round_trips": self.round_trips, "redis_errors": self.errors,
                "redis_processes": self.processes, "redis_admit_empty": self.empty_admissions,
                "redis_reserved_late": self.held_late,
                **{f"redis_calls/{op}": count for op, count in sorted(self.calls.items())}}


def _f(value: float) -> str:
    """A deadline for the script: -inf (never set) as its own "never"."""
    return repr(value) if math.isfinite(value) else "-1e18"
