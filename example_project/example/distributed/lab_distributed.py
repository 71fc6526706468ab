import time

from scrapy import signals
from scrapy_redis.spiders import RedisMixin

from example.spiders.lab import LabSpider
from scrapy_exitlimit._compat import set_idle_heartbeat

#: seconds between looks at the shared queue while this process has nothing to do
#: (Scrapy's engine looks every 5 s; here the work is fed by the other processes)
IDLE_POLL = 0.25


class LabDistributedSpider(RedisMixin, LabSpider):
    """The `lab` crawl shared by several processes: start as many as you like, alike.

    EXITLIMIT_REDIS_URL=redis://127.0.0.1:6379/0 EXITLIMIT_EXITS=http://127.0.0.1:PORT,... \\
        scrapy crawl lab_distributed -a origin=http://127.0.0.1:8000 -a pages=300

    Needs the project's distributed mode (EXITLIMIT_REDIS_URL in the environment):
    scrapy-redis's scheduler shares the queue and the seen-set, so every process offers
    page 0 and exactly one gets it through; scrapy_exitlimit's Redis backend shares the
    exits' limits. A process closes once it has been idle (nothing queued anywhere, nothing
    in flight here) for MAX_IDLE_TIME_BEFORE_CLOSE seconds. One crawl per empty Redis: the
    seen-set outlives it (SCHEDULER_PERSIST).
    """

    name = "lab_distributed"

    @classmethod
    def from_crawler(cls, crawler, *args, **kwargs):
        if not str(crawler.settings.get("SCHEDULER", "")).startswith("scrapy_redis."):
            raise ValueError("lab_distributed needs the distributed mode: set "
                             "EXITLIMIT_REDIS_URL=redis://HOST:PORT/DB in the environment")
        # what one process takes out of the shared queue at most; 0 would mean "no limit" to
        # Scrapy (one process would take everything) and "all of it" to scrapy-redis's
        # start-key reads. Unset, scrapy_exitlimit's add-on sizes it to the pool.
        if crawler.settings.getint("CONCURRENT_REQUESTS") < 1:
            raise ValueError("lab_distributed needs CONCURRENT_REQUESTS >= 1 (got "
                             f"{crawler.settings.get('CONCURRENT_REQUESTS')!r})")
        spider = super().from_crawler(crawler, *args, **kwargs)
        spider.setup_redis(crawler)  # as scrapy_redis.spiders.RedisSpider does
        crawler.signals.connect(spider._engine_started, signal=signals.engine_started)
        return spider

    def _engine_started(self):
        # a private knob of Scrapy's engine (see scrapy_exitlimit._compat): without it an
        # idle process would look for the work the others queue only every 5 s
        set_idle_heartbeat(self.crawler, IDLE_POLL)
        self._active()
        self.logger.info("taking up to CONCURRENT_REQUESTS=%d requests from the shared queue; "
                         "closing after %s s idle", self.crawler.settings.getint(
                             "CONCURRENT_REQUESTS"), self.max_idle_time)

    def parse(self, response):
        self._active()
        yield from super().parse(response)

    def _active(self):
        # scrapy-redis counts idle time from the last time its start key held URLs (the
        # crawl is seeded by start() instead), in whole seconds: count it from this
        # process's start and its last page, to the fraction, so it never closes early
        self.spider_idle_start_time = time.time()
