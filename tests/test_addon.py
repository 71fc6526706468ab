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


def test_gateway_templates_count_once_per_session():
    s = settings_after_addons(EXITLIMIT_EXITS=["http://u-{session}:p@127.0.0.1:7777", EXITS[0]],
                              EXITLIMIT_SESSIONS=20, EXITLIMIT_CONCURRENCY=2)
    assert s.getint("CONCURRENT_REQUESTS") == 21 * 2 + 21


def test_installs_the_credential_keyed_handler_unless_you_chose_one():
    from scrapy_exitlimit.addon import DOWNLOAD_HANDLER

    s = settings_after_addons(EXITLIMIT_EXITS=EXITS)
    assert s.getdict("DOWNLOAD_HANDLERS") == {"http": DOWNLOAD_HANDLER, "https": DOWNLOAD_HANDLER}
    mine = "myproject.handlers.Mine"
    s = settings_after_addons(EXITLIMIT_EXITS=EXITS, DOWNLOAD_HANDLERS={"https": mine})
    assert s.getdict("DOWNLOAD_HANDLERS") == {"http": DOWNLOAD_HANDLER, "https": mine}
    s = settings_after_addons(EXITLIMIT_EXITS=EXITS, EXITLIMIT_ENABLED=False)
    assert s.getdict("DOWNLOAD_HANDLERS") == {}


def test_your_own_middlewares_and_handlers_do_not_drop_ours():
    from scrapy_exitlimit.addon import DOWNLOAD_HANDLER

    s = settings_after_addons(EXITLIMIT_EXITS=EXITS, DOWNLOADER_MIDDLEWARES={"my.Mw": 5},
                              DOWNLOAD_HANDLERS={"ftp": None})
    assert s.getdict("DOWNLOADER_MIDDLEWARES") == {"my.Mw": 5, MIDDLEWARE: MIDDLEWARE_ORDER}
    assert s.getdict("DOWNLOAD_HANDLERS")["http"] == DOWNLOAD_HANDLER
