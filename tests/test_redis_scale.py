"""A large pool through the Redis backend costs what a small one does."""

from __future__ import annotations

import pytest_twisted
from scrapy.settings import Settings

import scrapy_exitlimit.backends.redis as backend_module
from scrapy_exitlimit.backends.redis import RedisBackend
from scrapy_exitlimit.config import ExitLimitConfig
from scrapy_exitlimit.core.limiter import INDEX_ABOVE

from .test_partition import _sleep
from .test_redis_backend import _drain, admit, redis_crawl_settings

N = INDEX_ABOVE * 4


def big_backend(redis_url: str) -> RedisBackend:
    settings = Settings({"EXITLIMIT_EXITS": [f"http://127.0.{i // 200}.{10 + i % 200}:3128"
                                             for i in range(N)],
                         "EXITLIMIT_RATE": 1000, **redis_crawl_settings(redis_url)})
    backend = RedisBackend(ExitLimitConfig.from_settings(settings), settings)
    backend.open()
    return backend


@pytest_twisted.ensureDeferred
async def test_a_large_pool_tries_the_exits_it_used_last_first(redis_url):
    """Their connections are open and their pairs proven: a crawl that always took the
    next exit round robin opened a connection per request."""
    backend = big_backend(redis_url)
    try:
        used = []
        for _ in range(5):
            lease = (await admit(backend, "http://o")).leases[0]
            used.append(lease.exit_id)
            backend.release(lease.id)  # answered: the pair is proven
            await _drain(backend)
            await _sleep(0.02)  # its next token (1000 r/s, plus the safety margin)
        assert len(set(used[1:])) == 1  # the first answer proved it: it is taken again
        busy = [(await admit(backend, "http://o", want=8)).leases for _ in range(2)]
        assert used[-1] in {lease.exit_id for lease in busy[0]}
    finally:
        await backend.close()


@pytest_twisted.ensureDeferred
async def test_quiet_answers_on_a_large_pool_look_at_what_was_learned_less_often(
        redis_url, monkeypatch):
    backend = big_backend(redis_url)
    looks = []
    mark = backend.limiter.learning_mark
    backend.limiter.learning_mark = lambda origin: looks.append(origin) or mark(origin)
    try:
        for exit_id in backend.limiter.exits:  # pair state for every exit
            backend.limiter.pair_state("http://o", exit_id)
        lease = (await admit(backend, "http://o")).leases[0]
        await _drain(backend)
        clock = [backend.clock() + 10]
        backend.clock = lambda: clock[0]
        looks.clear()
        every = backend_module.LEARN_CHECK * N / backend_module.LEARN_CHECK_PAIRS
        for _ in range(20):  # answers spread over one (scaled) look interval
            backend.success(lease, 0.01)
            clock[0] += every / 20 * 0.99
        assert len(looks) == 1
        backend.success(lease, 0.01)  # "concurrency_increase" and such: no look at once
        assert len(looks) <= 2
        looks.clear()
        backend.rate_limited(lease, 1.0)  # a rate decrease: at once
        assert len(looks) == 1
        await _drain(backend)
    finally:
        await backend.close()
