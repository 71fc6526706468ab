"""The Redis backend on a real Redis Cluster (3 masters, made with redis-cli --cluster)."""

from __future__ import annotations

import pytest
import pytest_twisted
import redis
from redis.cluster import RedisCluster
from scrapy.settings import Settings

from scrapy_exitlimit.backends.redis import RedisBackend
from scrapy_exitlimit.config import ExitLimitConfig
from scrapy_exitlimit.lab import Lab, OriginConfig

from .crawling import crawl_lab
from .test_partition import _sleep
from .test_redis_backend import _drain, admit, redis_crawl_settings

EXITS = ["http://127.0.0.10:3128", "http://127.0.0.11:3128"]


@pytest.fixture
def cluster_url(redis_cluster, request):
    """A node that does not serve the pool's slot (so the client must follow the cluster),
    with a prefix of the test's own: the tests share the cluster."""
    prefix = f"t{abs(hash(request.node.name)) % 10**8}"
    with RedisCluster.from_url(redis_cluster.urls[0]) as client:
        owner = client.get_node_from_key(f"{{{prefix}}}:x").port
    url = next(u for u, port in zip(redis_cluster.urls, redis_cluster.ports, strict=True)
               if port != owner)
    return url, prefix


def backends(url: str, prefix: str, count: int = 2, **extra) -> list[RedisBackend]:
    settings = Settings({"EXITLIMIT_EXITS": EXITS, "EXITLIMIT_BACKEND": "redis",
                         "EXITLIMIT_REDIS_URL": url, "EXITLIMIT_REDIS_PREFIX": prefix, **extra})
    config = ExitLimitConfig.from_settings(settings)
    made = []
    for _ in range(count):
        backend = RedisBackend(config, settings)
        backend.ping()
        made.append(backend)
    return made


def test_a_cluster_node_in_the_url_selects_the_cluster_client(cluster_url, redis_url):
    url, prefix = cluster_url
    (backend,) = backends(url, prefix, 1)
    assert backend.cluster and backend.describe().startswith("redis cluster at")
    (plain,) = backends(redis_url, prefix, 1)
    assert not plain.cluster


@pytest_twisted.ensureDeferred
async def test_admissions_and_shared_feedback_on_a_cluster(cluster_url, redis_cluster):
    url, prefix = cluster_url
    one, two = backends(url, prefix, EXITLIMIT_RATE=100)
    one.open()
    two.open()
    try:
        got = await admit(one, "http://o", want=2)
        assert len(got.leases) == 2  # one per exit
        one.rate_limited(got.leases[0], 30.0)  # the hold goes to the cluster
        await _drain(one)
        await _sleep(0.05)  # the other pair's next token (100 r/s)
        later = await admit(two, "http://o", want=2)
        # the other process sees the hold: only the other exit is admitted
        assert [lease.exit_id for lease in later.leases] == [got.leases[1].exit_id]
        assert two.processes == 2 or (await _beat(two)) == 2
    finally:
        await one.close()
        await two.close()
    with RedisCluster.from_url(url, decode_responses=True) as client:
        keys = client.keys(target_nodes=RedisCluster.ALL_NODES)
        ours = [k for k in keys if k.startswith(f"{{{prefix}}}:")]
        assert any(":pair:" in k for k in ours)
        # every key of the pool lives on the node that serves its slot
        node = client.get_node_from_key(f"{{{prefix}}}:x")
        with redis.Redis(host=node.host, port=node.port, decode_responses=True) as owner:
            assert set(ours) <= set(owner.keys(f"{{{prefix}}}:*"))
        # leases went back at close
        assert all(client.zcard(k) == 0 for k in ours if ":lease:" in k)


async def _beat(backend: RedisBackend) -> int:
    from .test_partition import _until

    await _until(lambda: backend.processes == 2, 3.0)
    return backend.processes


@pytest_twisted.ensureDeferred
async def test_a_crawl_on_a_cluster_loses_nothing_and_keeps_the_limit(cluster_url):
    url, prefix = cluster_url
    lab = Lab(exits=3, origin=OriginConfig(rate=10, burst=1))
    # 8 of 10 r/s: a redis-server reply late on a loaded machine can bunch two sends
    crawler = await crawl_lab(lab, redis_crawl_settings(url, EXITLIMIT_RATE=8,
                                                        EXITLIMIT_REDIS_PREFIX=prefix), 45)
    spider, stats = crawler.spider, crawler.stats.get_stats()
    assert len(spider.ok) == 45 and not spider.failed
    assert lab.origin.total(429) == 0
    for ip in lab.origin.ips():
        assert lab.origin.max_in_window(ip, 1.0) <= 10
    assert stats["exitlimit/redis_calls/admit"] > 0 and not stats.get("exitlimit/redis_errors")
