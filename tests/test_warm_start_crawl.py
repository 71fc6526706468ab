"""Warm start in real crawls against the lab: a second run starts from what the first
learned (EXITLIMIT_STATE_FILE, or Redis), a bad file never stops a crawl."""

from __future__ import annotations

import json
import logging
import time

import pytest_twisted
import redis

from scrapy_exitlimit.lab import Lab, OriginConfig
from scrapy_exitlimit.state_file import FORMAT, read

from .crawling import CALLBACK_DELAY, crawl

RATE = 4.0  # per exit IP, strict (no burst)
EXITS = 4
#: 429s a warm run of 60 pages may draw after its first second (none in it): one, where a
#: short cold run left a gap to bisect or a loaded machine let one request reach the limit
#: early; Scrapy < 2.18 trickles requests to the parking lot (see CALLBACK_DELAY), and drew
#: two once in CI. A wrong recall draws one on every exit (4) within its first second.
WARM_429S = 2 if CALLBACK_DELAY else 1
#: learned mode, starting above the limit: a cold run's discovery draws a 429 at once
LEARNED = {"EXITLIMIT_START_RATE": 2 * RATE, "EXITLIMIT_MAX_RETRIES": 20,
           # a loaded test machine delays requests on their way: a little more room
           "EXITLIMIT_SAFETY_MARGIN": 0.01}


def first_second(lab: Lab, seconds: float = 1.0) -> tuple[int, int]:
    """(clean answers, 429s) the origin gave in its first second (or ``seconds``)."""
    events = [e for ip in lab.origin.ips() for e in lab.origin.events(ip)]
    start = min(t for t, _ in events)
    early = [status for t, status in events if t < start + seconds]
    return early.count(200), early.count(429)


#: a warm pool paces near the learned rate from its first request: at least 3 of the 4 r/s
#: per exit over its first two seconds (the first request of each pair goes alone, then
#: pacing starts). Two seconds, not one: a stall of a loaded test machine in the first
#: second (10 answers of 16 once, in CI) is not a slow start, which stays far below
AT_ONCE = 2 * 3 * EXITS


def first_two_seconds_clean(lab: Lab) -> int:
    return first_second(lab, 2.0)[0]


async def crawl_on(lab: Lab, settings: dict, pages: int):
    lab.origin.reset()
    crawler = await crawl({"EXITLIMIT_EXITS": lab.exit_urls, **LEARNED, **settings},
                          lab.origin_url, pages)
    crawler.origin = lab.origin_url
    return crawler


@pytest_twisted.ensureDeferred
async def test_a_warm_run_draws_no_429_in_its_first_second_where_the_cold_run_did(tmp_path):
    path = tmp_path / "state.json"
    lab = Lab(exits=EXITS, origin=OriginConfig(rate=RATE))
    await lab.start()
    try:
        cold = await crawl_on(lab, {"EXITLIMIT_STATE_FILE": str(path)}, 80)
        cold_first, cold_two = first_second(lab), first_two_seconds_clean(lab)
        warm = await crawl_on(lab, {"EXITLIMIT_STATE_FILE": str(path)}, 60)
        warm_first = first_second(lab)
        warm_two = first_two_seconds_clean(lab)
    finally:
        await lab.stop()
    assert len(cold.spider.ok) == 80 and len(warm.spider.ok) == 60
    assert cold_first[1] >= 1, cold_first  # discovery above the limit
    stats = warm.stats.get_stats()
    assert stats["exitlimit/state_origins_loaded"] == 1
    assert warm_first[1] == 0, warm_first
    assert warm_two >= AT_ONCE and warm_two > cold_two, (warm_two, cold_two)
    # none in the first second (above); after it, one probe may draw a 429: a short cold
    # run may leave a gap between its clean rate and its ceiling that the warm run goes on
    # bisecting (its state was seen unsettled), and on a loaded machine it learns within
    # a few % of the limit (clean seen at 3.87 to 4.12 for 4 r/s)
    assert stats.get("exitlimit/response_429", 0) <= WARM_429S
    pool = read(path)[warm.origin]["pool"]
    assert 0.8 * RATE <= pool["clean"] <= 1.05 * RATE, pool


@pytest_twisted.ensureDeferred
async def test_a_corrupt_state_file_is_a_warning_and_replaced_once_the_crawl_learned(
        tmp_path, caplog):
    path = tmp_path / "state.json"
    path.write_text('{"format": "' + FORMAT + '", "version": 1, "origins": {"http://a')
    lab = Lab(exits=EXITS, origin=OriginConfig(rate=RATE))
    await lab.start()
    try:
        with caplog.at_level(logging.WARNING):  # long enough to prove a rate
            crawler = await crawl_on(lab, {"EXITLIMIT_STATE_FILE": str(path)}, 80)
    finally:
        await lab.stop()
    assert len(crawler.spider.ok) == 80
    assert crawler.stats.get_value("finish_reason") == "finished"
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("EXITLIMIT_STATE_FILE" in w and "not valid JSON" in w for w in warnings), warnings
    assert crawler.origin in read(path)  # what this crawl learned
    assert (tmp_path / "state.json.unreadable").read_text().startswith('{"format"')


@pytest_twisted.ensureDeferred
async def test_stale_entries_and_exits_gone_from_the_pool_are_left_out(tmp_path, caplog):
    lab = Lab(exits=2, origin=OriginConfig(rate=RATE))
    await lab.start()
    path = tmp_path / "state.json"
    now = time.time()
    own = {"clean": 1.0, "ceiling": 1.1, "seen": 1.1, "settled": True, "drift": 0.001}
    pool = {"clean": RATE * 0.95, "ceiling": RATE * 1.02, "seen": RATE * 1.02,
            "settled": True, "drift": 0.001}
    origins = {
        lab.origin_url: {"at": now - 60, "pool": pool, "site": None,
                         "pairs": {"127.0.0.99:3128": {"at": now - 60, "own": own},
                                   "127.0.0.98:3128": {"at": now - 3 * 86400, "own": own}}},
        "http://yesterday.test": {"at": now - 2 * 86400, "pool": pool, "site": None,
                                  "pairs": {}},
    }
    path.write_text(json.dumps({"format": FORMAT, "version": 1, "written": now - 60,
                                "origins": origins}))
    try:
        with caplog.at_level(logging.INFO):
            crawler = await crawl_on(lab, {"EXITLIMIT_STATE_FILE": str(path)}, 20)
        limited = first_second(lab)[1]
    finally:
        await lab.stop()
    stats = crawler.stats.get_stats()
    assert stats["exitlimit/state_origins_loaded"] == 1
    assert stats["exitlimit/state_pairs_loaded"] == 0
    assert limited == 0  # started at the remembered rate, not above it
    logged = caplog.text
    assert "1 pair(s) of exits no longer in the pool dropped" in logged, logged
    assert "older than EXITLIMIT_STATE_MAX_AGE: 1 origin(s), 1 pair(s)" in logged, logged
    # written back: the stale origin and pair are gone, the crawl's own is fresh
    kept = read(path)
    assert set(kept) == {crawler.origin}
    assert set(kept[crawler.origin]["pairs"]) == {"127.0.0.99:3128"}  # not stale: kept


# -- Redis: the learned state outlives the crawl processes ----------------------------------
def redis_settings(url: str, **extra) -> dict:
    return {"EXITLIMIT_BACKEND": "redis", "EXITLIMIT_REDIS_URL": url, **extra}


@pytest_twisted.ensureDeferred
async def test_redis_keeps_what_was_learned_for_the_next_crawl_processes(redis_url):
    lab = Lab(exits=EXITS, origin=OriginConfig(rate=RATE))
    await lab.start()
    try:
        await crawl_on(lab, redis_settings(redis_url, EXITLIMIT_STATE_MAX_AGE=7200), 80)
        cold_first = first_second(lab)
        client = redis.Redis.from_url(redis_url)
        [key] = client.keys("{exitlimit}:learn:*")
        assert 7000 < client.ttl(key) <= 7200  # EXITLIMIT_STATE_MAX_AGE, not a day
        # the crawl processes end and new ones start: the same Redis
        warm = await crawl_on(lab, redis_settings(redis_url), 60)
        warm_first = first_second(lab)
        warm_two = first_two_seconds_clean(lab)
    finally:
        await lab.stop()
    assert cold_first[1] >= 1, cold_first
    assert warm_first[1] == 0 and warm_two >= AT_ONCE, (warm_first, warm_two)
    # none in the first second (above), no storm after: the warm pace sits a few % under
    # the limit (the bench's 600 pages: 0.33 %)
    assert warm.stats.get_value("exitlimit/response_429", 0) <= WARM_429S
    assert 86000 < client.ttl(key) <= 86400  # kept a day from this run's last use
    client.close()


@pytest_twisted.ensureDeferred
async def test_an_empty_redis_is_seeded_from_the_state_file(redis_url, redis_server, tmp_path):
    path = tmp_path / "state.json"
    lab = Lab(exits=EXITS, origin=OriginConfig(rate=RATE))
    await lab.start()
    try:
        await crawl_on(lab, redis_settings(redis_url, EXITLIMIT_STATE_FILE=str(path)), 80)
        redis_server.stop()  # Redis restarts, empty
        redis_server.start()
        client = redis.Redis.from_url(redis_url)
        assert not client.keys("{exitlimit}:learn:*")
        warm = await crawl_on(lab, redis_settings(redis_url, EXITLIMIT_STATE_FILE=str(path)),
                              60)
        warm_first = first_second(lab)
        warm_two = first_two_seconds_clean(lab)
    finally:
        await lab.stop()
    assert warm.stats.get_value("exitlimit/state_origins_loaded") == 1
    assert warm_first[1] == 0 and warm_two >= AT_ONCE, (warm_first, warm_two)
    [key] = client.keys("{exitlimit}:learn:*")
    blob = json.loads(client.hget(key, "blob"))
    assert blob["estimate"]["proven"] and blob["estimate"]["lo"] <= 1.05 * RATE
    client.close()
