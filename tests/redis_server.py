"""Where the tests get a redis-server: skipped only on a developer's machine without one."""

from __future__ import annotations

import os
import shutil

import pytest

from scrapy_exitlimit.lab.redis_server import RedisServer, free_port

#: set (as .ci/run does) to make a missing redis-server an error, not a skip
REQUIRE = "EXITLIMIT_REQUIRE_REDIS"

__all__ = ["REQUIRE", "RedisServer", "free_port", "redis_binary"]


def redis_binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get(REQUIRE):
            pytest.fail(f"redis-server is not on PATH and {REQUIRE} is set")
        pytest.skip("redis-server is not installed (apt install redis-server); "
                    f"set {REQUIRE}=1 to make this an error")
    return binary
