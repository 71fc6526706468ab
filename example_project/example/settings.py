"""An ordinary Scrapy project that crawls through a proxy pool with scrapy_exitlimit."""

import os

BOT_NAME = "example"
SPIDER_MODULES = ["example.spiders"]
NEWSPIDER_MODULE = "example.spiders"
ROBOTSTXT_OBEY = False
TELNETCONSOLE_ENABLED = False

# The one line that turns scrapy_exitlimit on.
ADDONS = {"scrapy_exitlimit.Addon": 100}

# The pool: a list of proxy URLs, or a file with one per line (credentials allowed,
# they are never logged). `python -m scrapy_exitlimit.demo` passes the lab's exits.
EXITLIMIT_EXITS = os.environ.get("EXITLIMIT_EXITS", "exits.txt")

# What the origin allows each exit IP (leave it unset to have it learned from the
# server's 429s), and at most how many requests one exit carries at once.
EXITLIMIT_RATE = 5
EXITLIMIT_CONCURRENCY = 8

# With the rate learned, keep what was learned for the next run, which then starts at the
# learned rates instead of learning them again (`scrapy exitlimit-state` shows the file;
# entries older than EXITLIMIT_STATE_MAX_AGE, a day, are ignored).
# EXITLIMIT_STATE_FILE = "exitlimit-state.json"

# Distributed mode: with EXITLIMIT_REDIS_URL in the environment, any number of
# `scrapy crawl lab_distributed` processes share one request queue and one seen-set
# (scrapy-redis) and one set of exit limits (scrapy_exitlimit's Redis backend), so together
# they send each exit no more than EXITLIMIT_RATE. See README.md in this directory.
# (Not switched by a plain REDIS_URL: hosting platforms set that one for other purposes.)
if os.environ.get("EXITLIMIT_REDIS_URL"):
    # scrapy-redis's connection; scrapy_exitlimit's backend uses REDIS_URL too
    REDIS_URL = os.environ["EXITLIMIT_REDIS_URL"]
    # its spiders import scrapy-redis, which the single-process demo does not need
    SPIDER_MODULES = [*SPIDER_MODULES, "example.distributed"]
    EXITLIMIT_BACKEND = "redis"
    SCHEDULER = "scrapy_redis.scheduler.Scheduler"
    DUPEFILTER_CLASS = "scrapy_redis.dupefilter.RFPDupeFilter"
    # A process that finishes must not wipe the queue and the seen-set the others still
    # use: start each crawl on an empty Redis (or delete the "<spider>:*" keys) instead.
    SCHEDULER_PERSIST = True
    # Not SCHEDULER_IDLE_BEFORE_CLOSE: it blocks the whole process in BRPOP, downloads and
    # all. A RedisSpider idle (nothing queued anywhere, nothing in flight here) for this
    # many seconds closes.
    MAX_IDLE_TIME_BEFORE_CLOSE = 3
    # Each process takes up to CONCURRENT_REQUESTS requests out of the shared queue and
    # parks them until an exit is ready. The add-on sizes it for the whole pool (exits x
    # EXITLIMIT_CONCURRENCY + 16), so one process would hold most of a small crawl: take a
    # share instead (never 0, which Scrapy reads as "no limit"). The lab answers at once,
    # so 2 requests in flight per exit are plenty.
    EXITLIMIT_CONCURRENCY = 2
    CONCURRENT_REQUESTS = 24
