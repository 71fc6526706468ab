from __future__ import annotations

import os
import tempfile

import pytest

from .redis_server import RedisClusterServer, RedisServer, redis_binary, redis_cli

# the exit id key file (config.id_key) of the test run, not the user's: subprocesses
# inherit it, so their ids agree with this process's
os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="exitlimit-tests-")


class FakeClock:
    """Monotonic time that moves only when told to."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(scope="session")
def redis_server():
    """One redis-server for the session, on a free port; tests flush it via ``redis_url``."""
    server = RedisServer(redis_binary())
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server):
    if redis_server.proc is None:  # a restart test left it stopped
        redis_server.start()
    redis_server.flush()
    return redis_server.url


@pytest.fixture(scope="session")
def redis_cluster():
    """A real 3-master Redis Cluster on loopback ports, for the session."""
    cluster = RedisClusterServer(redis_binary(), redis_cli())
    cluster.start()
    yield cluster
    cluster.stop()
