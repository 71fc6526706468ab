import logging

from scrapy.utils.test import get_crawler

from scrapy_exitlimit.addon import MIDDLEWARE, MIDDLEWARE_ORDER

EXITS = [f"http://127.0.0.1:{9000 + i}" for i in range(10)]


def settings_after_addons(**values):
    crawler = get_crawler(settings_dict={"ADDONS": {"scrapy_exitlimit.Addon": 100}, **values})
    crawler._apply_settings()
    return crawler.settings


def test_inserts_the_middleware_and_sizes_concurrency_to_the_pool():
    s = settings_after_addons(EXITLIMIT_EXITS=EXITS, EXITLIMIT_CONCURRENCY=3)
    assert s.getdict("DOWNLOADER_MIDDLEWARES")[MIDDLEWARE] == MIDDLEWARE_ORDER
    assert 550 < MIDDLEWARE_ORDER < 750
    assert s.getint("CONCURRENT_REQUESTS") == 10 * 3 + 16
    assert s.getbool("AUTOTHROTTLE_ENABLED") is False


def test_user_values_win_and_a_too_small_pool_warns(caplog):
    with caplog.at_level(logging.WARNING):
        s = settings_after_addons(EXITLIMIT_EXITS=EXITS, CONCURRENT_REQUESTS=8,
                                  AUTOTHROTTLE_ENABLED=True)
    assert s.getint("CONCURRENT_REQUESTS") == 8
    assert s.getbool("AUTOTHROTTLE_ENABLED") is True
    text = caplog.text
    assert "CONCURRENT_REQUESTS (8) is below the pool's capacity" in text
    assert "AUTOTHROTTLE_ENABLED" in text


def test_exits_from_spider_custom_settings_are_seen():
    import scrapy

    class S(scrapy.Spider):
        name = "s"
        custom_settings = {"EXITLIMIT_EXITS": EXITS[:2]}

    crawler = get_crawler(S, {"ADDONS": {"scrapy_exitlimit.Addon": 100}})
    crawler._apply_settings()
    assert crawler.settings.getint("CONCURRENT_REQUESTS") == 2 * 8 + 16


def test_without_exits_nothing_is_sized():
    s = settings_after_addons()
    assert s.getint("CONCURRENT_REQUESTS") == 16
