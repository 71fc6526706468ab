import pytest
from scrapy.exceptions import NotConfigured
from scrapy.settings import Settings

from scrapy_exitlimit.config import ExitLimitConfig, NoExits

EXITS = ["http://127.0.0.1:9000", "http://u:secret@127.0.0.1:9001"]


def config(**values):
    return ExitLimitConfig.from_settings(Settings({"EXITLIMIT_EXITS": EXITS, **values}))


def test_defaults():
    c = config()
    assert [e.id for e in c.exits][0] == "127.0.0.1:9000"
    assert "secret" not in c.exits[1].id
    assert c.limits.rate is None  # learned
    assert c.limits.burst == 1 and c.limits.concurrency == 8 and c.limits.origin_rate is None
    assert c.max_retries == 8 and c.stall_timeout == 120.0
    assert c.tuning.start_rate == 2.0 and c.tuning.breaker_after == 5


def test_values_are_read():
    c = config(EXITLIMIT_RATE="5", EXITLIMIT_BURST=2, EXITLIMIT_CONCURRENCY=8,
               EXITLIMIT_ORIGIN_RATE=20, EXITLIMIT_MAX_RETRIES=0, EXITLIMIT_JITTER=0.2)
    assert (c.limits.rate, c.limits.burst, c.limits.concurrency) == (5.0, 2, 8)
    assert c.limits.origin_rate == 20.0 and c.limits.rate is not None and c.max_retries == 0
    assert c.tuning.jitter == 0.2


def test_disabled_is_not_configured_and_no_exits_is_an_error():
    with pytest.raises(NotConfigured):
        config(EXITLIMIT_ENABLED=False)
    with pytest.raises(NoExits, match="EXITLIMIT_EXITS is not set"):
        ExitLimitConfig.from_settings(Settings({}))


@pytest.mark.parametrize("value", [float("inf"), "maybe", [1]])
def test_a_switch_that_is_not_a_boolean_names_the_setting(value):
    # int(inf) raises OverflowError inside Scrapy's getbool (found by the config fuzzer)
    with pytest.raises(ValueError, match="EXITLIMIT_ENABLED .* must be True or False"):
        config(EXITLIMIT_ENABLED=value)


@pytest.mark.parametrize(("value", "said"), [
    ([], "an empty list, from the project settings"),
    ("", "an empty string (an empty environment variable?)"),
    ("  \n", "an empty string"),
    (["# only a comment", ""], "a list with no exit in it"),
])
def test_no_exits_says_what_and_where(value, said):
    with pytest.raises(NoExits, match="EXITLIMIT_EXITS") as info:
        ExitLimitConfig.from_settings(Settings({"EXITLIMIT_EXITS": value}))
    assert said in str(info.value) and "EXITLIMIT_ENABLED = False" in str(info.value)


def test_an_exits_file_of_comments_is_named(tmp_path):
    path = tmp_path / "exits.txt"
    path.write_text("# the pool\n\n# http://u:secret@p:1\n")
    settings = Settings()
    settings.set("EXITLIMIT_EXITS", str(path), priority="spider")
    with pytest.raises(NoExits) as info:
        ExitLimitConfig.from_settings(settings)
    text = str(info.value)
    assert str(path) in text and "custom_settings" in text and "secret" not in text


@pytest.mark.parametrize("value", [["127.0.0.1:9000", "u:secret@127.0.0.1:9001"],
                                   "127.0.0.1:9000, u:secret@127.0.0.1:9001"])
def test_host_port_means_http(value):
    c = ExitLimitConfig.from_settings(Settings({"EXITLIMIT_EXITS": value}))
    assert [e.url for e in c.exits] == ["http://127.0.0.1:9000",
                                        "http://u:secret@127.0.0.1:9001"]
    assert c.exits[0].id == "127.0.0.1:9000"


@pytest.mark.parametrize("scheme", ["socks5", "socks5h", "socks4", "ftp"])
def test_an_unsupported_scheme_is_refused_by_position_without_credentials(scheme):
    exits = ["http://127.0.0.1:9000", "# comment", f"{scheme}://user7:secret@10.0.0.1:1080"]
    with pytest.raises(ValueError) as info:
        ExitLimitConfig.from_settings(Settings({"EXITLIMIT_EXITS": exits}))
    text = str(info.value)
    assert text.startswith("EXITLIMIT_EXITS entry #3: scheme") and scheme in text
    assert "secret" not in text and "user7" not in text and "10.0.0.1" not in text


def test_redis_timeout_that_is_not_a_number_names_itself():
    with pytest.raises(ValueError, match=r"EXITLIMIT_REDIS_TIMEOUT \('fast'\) must be a number"):
        config(EXITLIMIT_REDIS_TIMEOUT="fast")


@pytest.mark.parametrize("value", ["Redis", "MEMORY", "postgres"])
def test_an_unknown_backend_lists_the_choices(value):
    with pytest.raises(ValueError) as info:
        config(EXITLIMIT_BACKEND=value)
    text = str(info.value)
    assert f"EXITLIMIT_BACKEND ({value!r})" in text
    assert "'memory', 'redis' or the path of a Backend class" in text
    if value.lower() in ("redis", "memory"):
        assert f"did you mean {value.lower()!r}" in text


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("EXITLIMIT_RATE", 0),
        ("EXITLIMIT_RATE", -5),
        ("EXITLIMIT_RATE", "fast"),
        ("EXITLIMIT_RATE", float("inf")),
        ("EXITLIMIT_RATE", float("nan")),
        ("EXITLIMIT_BURST", 0),
        ("EXITLIMIT_BURST", 1.5),
        ("EXITLIMIT_CONCURRENCY", 0),
        ("EXITLIMIT_ORIGIN_RATE", 0),
        ("EXITLIMIT_MAX_RETRIES", -1),
        ("EXITLIMIT_COOLDOWN_MAX", 0),
        ("EXITLIMIT_JITTER", -0.1),
        ("EXITLIMIT_SAFETY_MARGIN", "x"),
        ("EXITLIMIT_START_RATE", 0),
        ("EXITLIMIT_START_LEAP", 0),
        ("EXITLIMIT_MAX_RATE", -1),
        ("EXITLIMIT_BREAKER_THRESHOLD", 0),
        ("EXITLIMIT_EVICT_AFTER", 0.5),
        ("EXITLIMIT_STALL_TIMEOUT", 0),
    ],
)
def test_bad_values_name_the_setting(name, value):
    with pytest.raises(ValueError, match=name):
        config(**{name: value})


def test_cooldown_bounds_must_be_ordered():
    with pytest.raises(ValueError, match="EXITLIMIT_COOLDOWN_MIN"):
        config(EXITLIMIT_COOLDOWN_MIN=10, EXITLIMIT_COOLDOWN_MAX=5)


@pytest.mark.parametrize(
    "exits",
    [["ftp://127.0.0.1:21"], ["127.0.0.1"], ["http://127.0.0.1:notaport"],
     ["http://127.0.0.1:9000", "http://127.0.0.1:9000"], 42],
)
def test_bad_exits_name_the_setting(exits):
    with pytest.raises(ValueError, match="EXITLIMIT_EXITS"):
        ExitLimitConfig.from_settings(Settings({"EXITLIMIT_EXITS": exits}))


def test_bad_exit_error_does_not_leak_the_password():
    with pytest.raises(ValueError) as info:
        ExitLimitConfig.from_settings(Settings({"EXITLIMIT_EXITS": ["ftp://u:hunter2@h:1"]}))
    assert "hunter2" not in str(info.value)


def test_exits_from_a_file_and_from_a_string(tmp_path):
    path = tmp_path / "exits.txt"
    path.write_text("# pool\nhttp://127.0.0.1:9000\n\nhttp://127.0.0.1:9001\n")
    c = ExitLimitConfig.from_settings(Settings({"EXITLIMIT_EXITS": str(path)}))
    assert [e.id for e in c.exits] == ["127.0.0.1:9000", "127.0.0.1:9001"]
    c = ExitLimitConfig.from_settings(
        Settings({"EXITLIMIT_EXITS": "http://127.0.0.1:9000,http://127.0.0.1:9001"}))
    assert len(c.exits) == 2
    with pytest.raises(ValueError, match="EXITLIMIT_EXITS"):
        ExitLimitConfig.from_settings(Settings({"EXITLIMIT_EXITS": str(tmp_path / "nope")}))


def test_overrides_by_url_or_id():
    c = config(
        EXITLIMIT_RATE=5,
        EXITLIMIT_ORIGIN_SETTINGS={"http://site.test/": {"rate": 2, "origin_rate": 10}},
        EXITLIMIT_EXIT_SETTINGS={EXITS[1]: {"concurrency": 1, "rate": 1},
                                 "127.0.0.1:9000": {"burst": 3}},
    )
    secret_id = c.exits[1].id
    assert c.limits.exit_concurrency(secret_id) == 1
    assert c.limits.pair("http://site.test", secret_id).rate == 1
    assert c.limits.pair("http://site.test", "127.0.0.1:9000").rate == 2
    assert c.limits.pair("http://site.test", "127.0.0.1:9000").burst == 3
    assert c.limits.origin("http://site.test").rate == 10
    assert c.limits.origin("http://elsewhere.test").rate is None


@pytest.mark.parametrize(
    ("name", "value", "match"),
    [
        ("EXITLIMIT_EXIT_SETTINGS", {"http://127.0.0.1:1": {"rate": 1}}, "not in EXITLIMIT_EXITS"),
        ("EXITLIMIT_EXIT_SETTINGS", {EXITS[0]: {"speed": 1}}, "unknown keys"),
        ("EXITLIMIT_EXIT_SETTINGS", {EXITS[0]: {"concurrency": 0}}, "concurrency"),
        ("EXITLIMIT_ORIGIN_SETTINGS", {"http://a.test": {"rate": -1}}, "rate"),
        ("EXITLIMIT_ORIGIN_SETTINGS", {"http://a.test": 5}, "must be a dict"),
    ],
)
def test_bad_overrides(name, value, match):
    with pytest.raises(ValueError, match=match) as info:
        config(**{name: value})
    assert name in str(info.value)


def test_min_rate_must_not_exceed_max_rate():
    with pytest.raises(ValueError, match="EXITLIMIT_MIN_RATE"):
        config(EXITLIMIT_MIN_RATE=10, EXITLIMIT_MAX_RATE=5)


@pytest.mark.parametrize("policy", ["no.such.module.Policy", "scrapy_exitlimit.policy.Nope",
                                    "scrapy_exitlimit.policy.Signal"])
def test_a_bad_policy_names_the_setting(policy):
    from scrapy.utils.test import get_crawler

    from scrapy_exitlimit.middleware import ExitLimitMiddleware

    crawler = get_crawler(settings_dict={"EXITLIMIT_EXITS": EXITS, "EXITLIMIT_POLICY": policy})
    with pytest.raises(ValueError, match="EXITLIMIT_POLICY"):
        ExitLimitMiddleware.from_crawler(crawler)


def test_each_default_is_written_once_and_the_readme_agrees():
    """The settings table takes its defaults from the core (Limits, Tuning, ExitHealth,
    CRAWL_TUNING); the README's settings table shows the same numbers."""
    import re
    from pathlib import Path

    from scrapy.settings import Settings

    from scrapy_exitlimit import config as config_module
    from scrapy_exitlimit.core import Limits, Tuning
    from scrapy_exitlimit.core.health import ExitHealth
    from scrapy_exitlimit.core.limits import CRAWL_TUNING

    c = ExitLimitConfig.from_settings(Settings({"EXITLIMIT_EXITS": ["http://127.0.0.1:1"]}))
    assert c.tuning.margin == CRAWL_TUNING["margin"] and c.tuning.jitter == CRAWL_TUNING["jitter"]
    assert (c.tuning.evict_after, c.tuning.reanimate_after) == (
        Tuning().evict_after, Tuning().reanimate_after) == (
        ExitHealth().evict_after, ExitHealth().backoff)
    assert c.limits.concurrency == Limits().concurrency and c.redis_timeout == 1.0
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    shown = {}
    for names, defaults in re.findall(r"^\| (`EXITLIMIT_[^|]+) \| ([^|]+) \|", readme, re.M):
        for name, default in zip(re.findall(r"`(EXITLIMIT_\w+)`", names),
                                 re.findall(r"`([^`]+)`|unset|—", defaults), strict=False):
            shown[name] = default
    checked = 0
    for name, (_, _, _, _, default) in config_module._NUMBERS.items():
        if default is not None and shown.get(name):
            assert float(shown[name]) == default, (name, shown[name], default)
            checked += 1
    assert checked >= 15, checked
