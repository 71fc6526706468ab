"""A lean, pipelined Redis connection for the script's calls: the Redis backend's hot path.

Through redis-py's asyncio client one script call costs about 170 µs of CPU
here (a pool checkout, two ``wait_for`` tasks, pure-Python packing of ~50
arguments), and a crawl makes ~0.6 of them per request. This channel writes
each call on one socket at once and matches replies in order (Redis answers a
connection's commands in order); hiredis packs and parses: about 65 µs. One
timer per connection, not per call, watches for a reply that is late.

It covers what scrapy-redis users connect with: TCP or a Unix socket, with a
password or ACL user and a database number. Anything else (TLS, a credential
provider) goes through redis-py instead: :func:`open_channel` says so by
returning None.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import deque
from typing import Any

import redis
import redis.asyncio as aioredis

try:
    import hiredis
except ImportError:  # pragma: no cover - exercised by forcing the fallback in tests
    hiredis = None


class _Protocol(asyncio.Protocol):
    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.reader = hiredis.Reader(encoding="utf-8", replyError=redis.ResponseError,
                                     protocolError=redis.InvalidResponse)
        self.waiting: deque[tuple[asyncio.Future, float]] = deque()
        self.transport: asyncio.Transport | None = None
        self.closed: BaseException | None = None
        self._watch: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        reader = self.reader
        reader.feed(data)
        try:
            while self.waiting:
                reply = reader.gets()
                if reply is False:
                    break
                future = self.waiting.popleft()[0]
                if future.done():  # its caller gave up
                    continue
                if isinstance(reply, redis.ResponseError):
                    future.set_exception(_error(reply))
                else:
                    future.set_result(reply)
        except redis.InvalidResponse as exc:
            self.fail(exc)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.fail(redis.ConnectionError(f"connection to Redis lost: {exc or 'closed'}"))

    def send(self, args: tuple[Any, ...]) -> asyncio.Future:
        if self.closed is not None:
            raise redis.ConnectionError(str(self.closed))
        assert self.transport is not None
        self.transport.write(hiredis.pack_command(args))
        future = self._loop.create_future()
        deadline = self._loop.time() + self.timeout
        self.waiting.append((future, deadline))
        if self._watch is None:
            self._watch = self._loop.call_at(deadline, self._check)
        return future

    def _check(self) -> None:
        """The oldest call is the first to be late: replies come in order."""
        self._watch = None
        if not self.waiting or self.closed is not None:
            return
        deadline = self.waiting[0][1]
        if self._loop.time() >= deadline:
            self.fail(redis.TimeoutError(f"no reply from Redis within {self.timeout:g} s"))
        else:
            self._watch = self._loop.call_at(deadline, self._check)

    def fail(self, exc: BaseException) -> None:
        if self.closed is None:
            self.closed = exc
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        while self.waiting:
            future = self.waiting.popleft()[0]
            if not future.done():
                future.set_exception(exc)
        if self.transport is not None:
            self.transport.abort()


def _error(reply: redis.ResponseError) -> redis.ResponseError:
    text = str(reply)
    if text.startswith("NOSCRIPT"):
        return redis.exceptions.NoScriptError(text)
    if text.startswith(("NOAUTH", "WRONGPASS")):
        return redis.AuthenticationError(text)
    return reply


class ScriptChannel:
    """Script calls (EVALSHA, loading the script when Redis does not know it) on one
    pipelined connection, opened on first use and again after it was lost."""

    def __init__(self, connection: aioredis.Connection, script: str) -> None:
        self._conn = connection  # redis-py's parsed settings, never connected itself
        self.script = script
        self.sha = hashlib.sha1(script.encode()).hexdigest()
        self._protocol: _Protocol | None = None
        self._opening: asyncio.Future | None = None
        self._closed = False

    async def call(self, keys: list[str], args: list[Any]) -> Any:
        protocol = self._protocol
        if protocol is None or protocol.closed is not None:
            protocol = await self._open()
        command = ("EVALSHA", self.sha, len(keys), *keys, *args)
        try:
            return await protocol.send(command)
        except redis.exceptions.NoScriptError:  # a restarted or flushed Redis
            await protocol.send(("SCRIPT", "LOAD", self.script))
            return await protocol.send(command)

    async def _open(self) -> _Protocol:
        if self._opening is None:  # concurrent callers share one connection attempt
            self._opening = asyncio.ensure_future(self._connect())
            self._opening.add_done_callback(self._opened)
        return await asyncio.shield(self._opening)

    def _opened(self, opening: asyncio.Future) -> None:
        self._opening = None
        if not opening.cancelled():
            opening.exception()  # its callers have it; nothing left unretrieved

    async def _connect(self) -> _Protocol:
        conn, loop = self._conn, asyncio.get_running_loop()
        timeout = conn.socket_timeout or 1.0

        def factory() -> _Protocol:
            return _Protocol(timeout)

        try:
            if isinstance(conn, aioredis.UnixDomainSocketConnection):
                opening = loop.create_unix_connection(factory, conn.path)
            else:
                opening = loop.create_connection(factory, conn.host, conn.port)
            _, protocol = await asyncio.wait_for(opening, conn.socket_connect_timeout or timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            raise redis.ConnectionError(f"cannot connect to Redis: {exc}") from None
        handshake = []
        if conn.password:
            handshake.append(protocol.send(("AUTH", conn.username, conn.password)
                                           if conn.username else ("AUTH", conn.password)))
        if conn.db:
            handshake.append(protocol.send(("SELECT", conn.db)))
        try:
            for reply in handshake:
                await reply
        except BaseException:
            protocol.fail(redis.ConnectionError("Redis handshake failed"))
            raise
        if self._closed:  # closed while connecting: no connection left behind
            protocol.fail(redis.ConnectionError("channel closed"))
            raise redis.ConnectionError("channel closed")
        self._protocol = protocol
        return protocol

    def close(self) -> None:
        self._closed = True
        if self._protocol is not None:
            self._protocol.fail(redis.ConnectionError("channel closed"))
            self._protocol = None


def open_channel(client: aioredis.Redis, script: str) -> ScriptChannel | None:
    """A channel for this client's settings, or None where redis-py must do the work
    (hiredis missing, TLS, a credential provider, another connection class)."""
    if hiredis is None:
        return None
    conn = client.connection_pool.make_connection()
    if type(conn) not in (aioredis.Connection, aioredis.UnixDomainSocketConnection):
        return None
    if getattr(conn, "credential_provider", None) is not None:
        return None
    return ScriptChannel(conn, script)
