import logging

import pytest
from scrapy.downloadermiddlewares.httpproxy import HttpProxyMiddleware
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler

from scrapy_exitlimit._compat import apply_settings
from scrapy_exitlimit.addon import (
    MIDDLEWARE,
    MIDDLEWARE_ORDER,
    PROGRESS,
    START_MIDDLEWARE,
    AddonConfigError,
    user_order,
)
from scrapy_exitlimit.config import NoExits, read_exits
from scrapy_exitlimit.middleware import ExitLimitMiddleware

EXITS = [f"http://127.0.0.1:{9000 + i}" for i in range(10)]


class MyMiddleware:
    """A user's own downloader middleware."""


def settings_after_addons(**values):
    crawler = get_crawler(settings_dict={"ADDONS": {"scrapy_exitlimit.Addon": 100}, **values})
    apply_settings(crawler)
    return crawler.settings


def test_inserts_the_middleware_and_sizes_concurrency_to_the_pool():
    s = settings_after_addons(EXITLIMIT_EXITS=EXITS, EXITLIMIT_CONCURRENCY=3)
    assert user_order(s, "DOWNLOADER_MIDDLEWARES", MIDDLEWARE) == (True, MIDDLEWARE_ORDER)
    assert user_order(s, "EXTENSIONS", PROGRESS) == (True, 510)
    # outermost of the spider middlewares: Scrapy's StartSpiderMiddleware is at 25
    assert user_order(s, "SPIDER_MIDDLEWARES", START_MIDDLEWARE) == (True, 10)
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
    apply_settings(crawler)
    assert crawler.settings.getint("CONCURRENT_REQUESTS") == 2 * 8 + 16


@pytest.mark.parametrize("exits", [None, [], "", ["# a comment"]])
def test_without_exits_the_addon_refuses_to_start(exits):
    values = {} if exits is None else {"EXITLIMIT_EXITS": exits}
    with pytest.raises(NoExits, match="EXITLIMIT_EXITS"):
        settings_after_addons(**values)


def test_disabled_the_addon_adds_nothing():
    s = settings_after_addons(EXITLIMIT_ENABLED=False)
    assert s.getint("CONCURRENT_REQUESTS") == 16
    assert user_order(s, "DOWNLOADER_MIDDLEWARES", MIDDLEWARE) == (False, None)
    assert user_order(s, "SPIDER_MIDDLEWARES", START_MIDDLEWARE) == (False, None)


def test_gateway_templates_count_once_per_session():
    s = settings_after_addons(EXITLIMIT_EXITS=["http://u-{session}:p@127.0.0.1:7777", EXITS[0]],
                              EXITLIMIT_SESSIONS=20, EXITLIMIT_CONCURRENCY=2)
    assert s.getint("CONCURRENT_REQUESTS") == 21 * 2 + 21


def test_per_exit_concurrency_sizes_the_pool():
    # as the probe suggests: keyed by URL or by id; a malformed table counts as none
    ids = [e.id for e in read_exits(Settings({"EXITLIMIT_EXITS": EXITS[:2]}))]
    s = settings_after_addons(EXITLIMIT_EXITS=EXITS[:2], EXITLIMIT_EXIT_SETTINGS={
        EXITS[0]: {"concurrency": 24}, ids[1]: {"concurrency": 4}})
    assert s.getint("CONCURRENT_REQUESTS") == 24 + 4 + 16
    s = settings_after_addons(EXITLIMIT_EXITS=EXITS[:2], EXITLIMIT_EXIT_SETTINGS="nonsense")
    assert s.getint("CONCURRENT_REQUESTS") == 2 * 8 + 16


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

    mine = f"{__name__}.MyMiddleware"
    s = settings_after_addons(EXITLIMIT_EXITS=EXITS, DOWNLOADER_MIDDLEWARES={mine: 5},
                              DOWNLOAD_HANDLERS={"ftp": None})
    assert s.getdict("DOWNLOADER_MIDDLEWARES") == {mine: 5, ExitLimitMiddleware: MIDDLEWARE_ORDER}
    assert s.getdict("DOWNLOAD_HANDLERS")["http"] == DOWNLOAD_HANDLER


@pytest.mark.parametrize("key", [MIDDLEWARE, ExitLimitMiddleware], ids=["path", "class"])
def test_your_order_for_the_middleware_is_kept(key):
    s = settings_after_addons(EXITLIMIT_EXITS=EXITS, DOWNLOADER_MIDDLEWARES={key: 600})
    assert user_order(s, "DOWNLOADER_MIDDLEWARES", MIDDLEWARE) == (True, 600)
    assert len(s.getdict("DOWNLOADER_MIDDLEWARES")) == 1


def test_the_progress_extension_set_to_none_stays_off():
    s = settings_after_addons(EXITLIMIT_EXITS=EXITS, EXTENSIONS={PROGRESS: None})
    assert user_order(s, "EXTENSIONS", PROGRESS) == (True, None)
    assert len(s.getdict("EXTENSIONS")) == 1


def test_the_start_middleware_set_to_none_stays_off():
    s = settings_after_addons(EXITLIMIT_EXITS=EXITS, SPIDER_MIDDLEWARES={START_MIDDLEWARE: None})
    assert user_order(s, "SPIDER_MIDDLEWARES", START_MIDDLEWARE) == (True, None)
    assert len(s.getdict("SPIDER_MIDDLEWARES")) == 1


def test_the_middleware_set_to_none_with_the_addon_on_is_refused():
    """EXITLIMIT_ENABLED = False is the one off switch: None would crawl without exits."""
    with pytest.raises(AddonConfigError, match="EXITLIMIT_ENABLED = False"):
        settings_after_addons(EXITLIMIT_EXITS=EXITS, DOWNLOADER_MIDDLEWARES={MIDDLEWARE: None})


def built(crawler, kind):
    """The components Scrapy built, once the crawl's engine exists."""
    if kind == "extensions":
        return crawler.extensions.middlewares
    return crawler.engine.downloader.middleware.middlewares


@pytest.mark.parametrize(("order", "warning"), [
    (800, "comes after HttpProxyMiddleware (750)"),
    (500, "comes before RetryMiddleware (550)"),
    (600, None),
])
def test_an_order_that_hurts_is_warned_about_with_why(order, warning, caplog):
    from scrapy_exitlimit.wiring import order_problems

    s = settings_after_addons(EXITLIMIT_EXITS=EXITS, DOWNLOADER_MIDDLEWARES={MIDDLEWARE: order})
    problems = order_problems(s)
    if warning is None:
        assert problems == []
    else:
        assert len(problems) == 1 and warning in problems[0]
        assert "Proxy-Authorization" in problems[0] or "Retry-After" in problems[0]


def test_a_moved_http_proxy_middleware_is_taken_into_account():
    from scrapy_exitlimit.wiring import order_problems

    s = settings_after_addons(EXITLIMIT_EXITS=EXITS,
                              DOWNLOADER_MIDDLEWARES={HttpProxyMiddleware: 580})
    assert "HttpProxyMiddleware (580)" in order_problems(s)[0]


def test_without_the_addon_the_middleware_works_and_warns_with_the_numbers(caplog):
    from scrapy_exitlimit.wiring import check_wiring

    crawler = get_crawler(settings_dict={"EXITLIMIT_EXITS": EXITS,
                                         "DOWNLOADER_MIDDLEWARES": {MIDDLEWARE: 585}})
    apply_settings(crawler)
    with caplog.at_level(logging.WARNING):
        check_wiring(crawler, len(EXITS), 8)
    text = caplog.text
    assert "without the add-on" in text and "ADDONS" in text
    assert "CONCURRENT_REQUESTS = 96 (now 16; below" in text and "10 exits x 8 = 80" in text
    assert "CredentialKeyedDownloadHandler" in text and "ExitLimitProgress" in text
    assert "CooperativeStartMiddleware" in text
    caplog.clear()
    crawler = get_crawler(settings_dict={"EXITLIMIT_EXITS": EXITS,
                                         "ADDONS": {"scrapy_exitlimit.Addon": 100}})
    apply_settings(crawler)
    with caplog.at_level(logging.WARNING):
        check_wiring(crawler, len(EXITS), 8)
    assert caplog.text == ""
