from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from importlib import resources

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.internal.conjecture import engine as _hypothesis_engine

from .redis_server import RedisClusterServer, RedisServer, redis_binary, redis_cli

# the exit id key file (config.id_key) of the test run, not the user's: subprocesses
# inherit it, so their ids agree with this process's
os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="exitlimit-tests-")
atexit.register(shutil.rmtree, os.environ["XDG_CONFIG_HOME"], ignore_errors=True)

#: seconds Hypothesis may spend shrinking one failure. The run's per-test timeout
#: (setup.cfg, 120 s) kills the whole session, with no example and no summary, so a
#: failing property must finish shrinking well before it: generation (max_examples) plus
#: this stays under it. Hypothesis's own limit is 300 s and not a setting: the module
#: constant is its one knob (read each time shrinking starts); without it, shrinking
#: still stops after MAX_SHRINKS successful steps.
SHRINK_SECONDS = 45
if hasattr(_hypothesis_engine, "MAX_SHRINKING_SECONDS"):
    _hypothesis_engine.MAX_SHRINKING_SECONDS = SHRINK_SECONDS

# the defaults of every property test (a test's own @settings adds to them): no example
# database (nothing written into the work tree), no deadline (a loaded machine is not a
# bug), and the failing example printed in a form that can be pasted back (@reproduce_failure)
settings.register_profile("exitlimit", database=None, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "exitlimit"))


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


@pytest.fixture(scope="module")
def lua_client(redis_server):
    """A client of the session's redis-server, and exitlimit.lua registered on it."""
    import redis

    if redis_server.proc is None:  # (a test that stopped it)
        redis_server.start()
    lua = resources.files("scrapy_exitlimit.backends").joinpath("exitlimit.lua").read_text()
    client = redis.Redis(port=redis_server.port, decode_responses=True)
    yield client, client.register_script(lua)
    client.close()
