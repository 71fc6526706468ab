"""Where the tests get a redis-server: skipped only on a developer's machine without one."""

from __future__ import annotations

import os
import shutil

import pytest

from scrapy_exitlimit.lab.redis_server import RedisClusterServer, RedisServer, free_port

#: set (as .ci/run does) to make a missing redis-server an error, not a skip
REQUIRE = "EXITLIMIT_REQUIRE_REDIS"

__all__ = ["REQUIRE", "RedisClusterServer", "RedisServer", "free_port", "redis_binary",
           "redis_cli"]


def redis_binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get(REQUIRE):
            pytest.fail(f"redis-server is not on PATH and {REQUIRE} is set")
        pytest.skip("redis-server is not installed (apt install redis-server); "
                    f"set {REQUIRE}=1 to make this an error")
    return binary


def redis_cli() -> str:
    """redis-cli, which makes a Redis Cluster out of redis-servers (Debian's redis-server
    package brings it along as redis-tools)."""
    binary = shutil.which("redis-cli")
    if binary is None:
        if os.environ.get(REQUIRE):
            pytest.fail(f"redis-cli is not on PATH and {REQUIRE} is set")
        pytest.skip(f"redis-cli is not installed (apt install redis-tools); set {REQUIRE}=1 "
                    "to make this an error")
    return binary
