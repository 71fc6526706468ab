"""The lean script channel (the Redis backend's hot path) against a real redis-server."""

from __future__ import annotations

import asyncio
import gc
import os
import tempfile

import pytest
import pytest_twisted
import redis
import redis.asyncio as aioredis
from scrapy.settings import Settings
from twisted.internet.defer import Deferred

from scrapy_exitlimit.backends import channel as channel_module
from scrapy_exitlimit.backends.channel import ScriptChannel, open_channel
from scrapy_exitlimit.backends.redis import RedisBackend
from scrapy_exitlimit.config import ExitLimitConfig

from .redis_server import RedisServer, redis_binary

ECHO = "return {KEYS[1], ARGV[1]}"


def run(coro):
    """An asyncio coroutine awaited from a Twisted test."""
    return Deferred.fromFuture(asyncio.ensure_future(coro))


def channel_for(url: str, script: str = ECHO, **params) -> ScriptChannel:
    channel = open_channel(aioredis.Redis.from_url(url, decode_responses=True, **params), script)
    assert channel is not None
    return channel


@pytest_twisted.ensureDeferred
async def test_pipelined_calls_get_their_own_replies_in_order(redis_url):
    channel = channel_for(redis_url)

    async def many():
        calls = [channel.call([f"k{i}"], [i]) for i in range(200)]  # all written at once
        return await asyncio.gather(*calls)

    try:
        replies = await run(many())
        assert replies == [[f"k{i}", str(i)] for i in range(200)]
    finally:
        channel.close()


@pytest_twisted.ensureDeferred
async def test_a_script_redis_forgot_is_loaded_again(redis_url):
    channel = channel_for(redis_url)
    try:
        assert await run(channel.call(["a"], [1])) == ["a", "1"]
        with redis.Redis.from_url(redis_url) as client:
            client.script_flush()  # as a restarted Redis would
        assert await run(channel.call(["b"], [2])) == ["b", "2"]
    finally:
        channel.close()


@pytest_twisted.ensureDeferred
async def test_script_errors_surface_as_redis_errors(redis_url):
    channel = channel_for(redis_url, script="return redis.call('NOSUCHCOMMAND')")
    try:
        with pytest.raises(redis.ResponseError):
            await run(channel.call(["a"], []))
        # the connection is still good for the next call
        with pytest.raises(redis.ResponseError):
            await run(channel.call(["a"], []))
    finally:
        channel.close()


async def fake_redis(protocol: type[asyncio.Protocol]) -> tuple[asyncio.Server, str]:
    """A loopback server speaking ``protocol`` where Redis should be, and its URL."""
    server = await run(asyncio.get_event_loop().create_server(protocol, "127.0.0.1", 0))
    return server, f"redis://127.0.0.1:{server.sockets[0].getsockname()[1]}/0"


@pytest_twisted.ensureDeferred
async def test_a_silent_redis_times_out_within_the_socket_timeout():
    """Accepts, never answers: the call fails after EXITLIMIT_REDIS_TIMEOUT, not never."""
    loop = asyncio.get_event_loop()
    server, url = await fake_redis(asyncio.Protocol)
    channel = channel_for(url, socket_timeout=0.2)
    try:
        started = loop.time()
        with pytest.raises(redis.TimeoutError):
            await run(channel.call(["a"], [1]))
        assert 0.15 <= loop.time() - started < 2.0
    finally:
        channel.close()
        server.close()


class HangUp(asyncio.Protocol):
    """A server that reads the first command and hangs up without answering."""

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.transport.close()


@pytest_twisted.ensureDeferred
async def test_a_lost_connection_fails_the_calls_in_flight():
    server, url = await fake_redis(HangUp)
    channel = channel_for(url)
    try:
        with pytest.raises(redis.ConnectionError):
            await run(channel.call(["a"], [1]))
    finally:
        channel.close()
        server.close()


@pytest_twisted.ensureDeferred
async def test_the_call_after_a_lost_connection_opens_a_new_one(redis_url):
    channel = channel_for(redis_url)
    try:
        assert await run(channel.call(["k"], [1])) == ["k", "1"]
        with redis.Redis.from_url(redis_url) as client:
            assert client.client_kill_filter(_type="normal", skipme=True) >= 1
        await run(asyncio.sleep(0.1))  # the loop sees the hang-up
        assert await run(channel.call(["k"], [2])) == ["k", "2"]
    finally:
        channel.close()


@pytest_twisted.ensureDeferred
async def test_acl_user_password_and_database_are_honoured(redis_server, redis_url):
    with redis.Redis.from_url(redis_url) as client:
        client.acl_setuser("crawler", enabled=True, passwords=["+s3cret"], keys=["*"],
                           commands=["+@all"])
    base = f"127.0.0.1:{redis_server.port}"
    good = channel_for(f"redis://crawler:s3cret@{base}/3",
                       script="redis.call('SET', KEYS[1], ARGV[1]) return 1")
    bad = channel_for(f"redis://crawler:wrong@{base}/0")
    try:
        assert await run(good.call(["in-db-3"], ["x"])) == 1
        with redis.Redis.from_url(f"redis://{base}/3") as client:
            assert client.get("in-db-3") == b"x"
        with pytest.raises(redis.AuthenticationError):
            await run(bad.call(["a"], [1]))
    finally:
        good.close()
        bad.close()
        with redis.Redis.from_url(redis_url) as client:
            client.acl_deluser("crawler")


@pytest_twisted.ensureDeferred
async def test_unix_socket():
    with tempfile.TemporaryDirectory(prefix="exitlimit-sock-") as where:
        path = os.path.join(where, "redis.sock")
        server = RedisServer(redis_binary(), "--unixsocket", path)
        server.start()
        channel = channel_for(f"unix://{path}?db=1")
        try:
            assert await run(channel.call(["u"], [5])) == ["u", "5"]
        finally:
            channel.close()
            server.stop()


def test_a_throwaway_redis_servers_directory_goes_with_it():
    """Stopped, a server may start again in its directory; once dropped, the directory
    is removed (test runs left one per server in /tmp)."""
    server = RedisServer(redis_binary())
    where = server.dir
    server.start()
    server.stop()
    server.start()  # a restart (the outage tests) still finds it
    server.stop()
    assert os.path.isdir(where)
    del server
    gc.collect()
    assert not os.path.exists(where)


def test_what_the_channel_cannot_speak_goes_through_redis_py(monkeypatch):
    tls = aioredis.Redis.from_url("rediss://127.0.0.1:6390/0")
    assert open_channel(tls, ECHO) is None
    monkeypatch.setattr(channel_module, "hiredis", None)
    assert open_channel(aioredis.Redis.from_url("redis://127.0.0.1:6390/0"), ECHO) is None


@pytest_twisted.ensureDeferred
async def test_the_backend_admits_through_redis_py_when_there_is_no_channel(redis_url,
                                                                             monkeypatch):
    monkeypatch.setattr(channel_module, "hiredis", None)
    settings = Settings({"EXITLIMIT_EXITS": ["http://127.0.0.10:3128"], "EXITLIMIT_RATE": 50,
                         "EXITLIMIT_BACKEND": "redis", "EXITLIMIT_REDIS_URL": redis_url})
    backend = RedisBackend(ExitLimitConfig.from_settings(settings), settings)
    backend.open()
    through_redis_py = []
    script = backend._script

    async def recorded(**kwargs):
        through_redis_py.append(kwargs["args"][0])
        return await script(**kwargs)

    backend._script = recorded
    try:
        assert backend._channel is None
        got = await Deferred.fromFuture(backend.admit("http://o", 1, backend.clock()))
        assert len(got.leases) == 1
        assert "admit" in through_redis_py  # (the first heartbeat may go first)
    finally:
        await backend.close()


@pytest_twisted.ensureDeferred
async def test_a_channel_closed_while_connecting_leaves_no_connection(redis_url):
    channel = channel_for(redis_url)
    call = asyncio.ensure_future(channel.call(["a"], [1]))  # starts connecting
    channel.close()
    with pytest.raises(redis.ConnectionError):
        await Deferred.fromFuture(call)
    assert channel._protocol is None
