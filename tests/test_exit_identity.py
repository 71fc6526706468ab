"""Exit ids and gateway templates: one exit per session, ids masked and stable."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest
from scrapy.settings import Settings

from scrapy_exitlimit.config import ExitLimitConfig, read_exits
from scrapy_exitlimit.core import exit_id, expand_templates, parse_exit_list, parse_sessions

GATEWAY = "http://cust-4711-session-{session}:hunter2@gw.example:7777"


def config(**values):
    return ExitLimitConfig.from_settings(Settings(values))


# -- sessions and expansion (pure) --------------------------------------------------


@pytest.mark.parametrize(
    ("value", "names"),
    [(3, ["1", "2", "3"]), ("2", ["1", "2"]), (["eu", "us"], ["eu", "us"]),
     ("a, b c", ["a", "b", "c"]), ((7, "x"), ["7", "x"]), (None, None), ("", None), ([], None)],
)
def test_sessions_are_a_count_or_names(value, names):
    assert parse_sessions(value) == names


@pytest.mark.parametrize(
    "value", [0, -1, True, 2.5, 10_001, ["a", "a"], ["a b"], ["x@y"], [""], [None], {"a": 1}]
)
def test_bad_sessions_are_refused(value):
    with pytest.raises(ValueError):
        parse_sessions(value)


def test_a_template_expands_once_per_session_and_other_lines_stay():
    lines = ["# comment with {session}", GATEWAY, "http://plain:1", ""]
    out = expand_templates(lines, ["1", "2"])
    assert [url for url, _, _ in out] == [
        "# comment with {session}",
        "http://cust-4711-session-1:hunter2@gw.example:7777",
        "http://cust-4711-session-2:hunter2@gw.example:7777",
        "http://plain:1",
        "",
    ]
    assert out[1][1:] == (GATEWAY, "1") and out[3][1:] == (None, None)


def test_a_template_without_sessions_is_refused_without_its_secret():
    with pytest.raises(ValueError, match="session") as info:
        expand_templates([GATEWAY], None)
    assert "hunter2" not in str(info.value) and "cust-4711" not in str(info.value)


# -- ids -----------------------------------------------------------------------------


def test_id_forms():
    assert exit_id("http://10.0.0.1:8000") == "10.0.0.1:8000"
    assert exit_id("socks5://10.0.0.1:1080") == "socks5://10.0.0.1:1080"
    url = "http://u:p@10.0.0.1:8000"
    assert exit_id(url) == "10.0.0.1:8000~" + hashlib.sha256(url.encode()).hexdigest()[:10]
    sessions = parse_exit_list([GATEWAY], ["1", "eu-7"])
    digest = hashlib.sha256(GATEWAY.encode()).hexdigest()[:10]
    assert [e.id for e in sessions] == [f"gw.example:7777~{digest}~s=1",
                                        f"gw.example:7777~{digest}~s=eu-7"]


def test_ids_tell_credentials_and_sessions_apart_and_hide_them():
    urls = ["http://alice:pw1@gw.example:7777", "http://alice:pw2@gw.example:7777",
            "http://bob:pw1@gw.example:7777", GATEWAY,
            GATEWAY.replace("cust-4711", "cust-4712")]
    exits = parse_exit_list(urls, ["1", "2"])
    ids = [e.id for e in exits]
    assert len(set(ids)) == len(ids) == 7
    for ex in exits:
        for secret in ("alice", "bob", "pw1", "pw2", "hunter2", "cust-4711", "cust-4712"):
            assert secret not in ex.id and secret not in repr(ex) and secret not in str(ex)


def test_ids_are_the_same_in_another_process():
    code = ("from scrapy_exitlimit.core import parse_exit_list; "
            f"print(*[e.id for e in parse_exit_list([{GATEWAY!r}, 'http://u:p@h:1'], "
            "['1', '2'])])")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout.split()
    assert other == [e.id for e in parse_exit_list([GATEWAY, "http://u:p@h:1"], ["1", "2"])]


# -- settings ------------------------------------------------------------------------


def test_sessions_setting_expands_templates():
    c = config(EXITLIMIT_EXITS=[GATEWAY, "http://127.0.0.1:9000"], EXITLIMIT_SESSIONS=3)
    assert len(c.exits) == 4
    assert [e.url for e in c.exits[:3]] == [GATEWAY.replace("{session}", s) for s in "123"]
    assert [e.id.rsplit("~", 1)[1] for e in c.exits[:3]] == ["s=1", "s=2", "s=3"]
    assert c.exits[3].id == "127.0.0.1:9000"


def test_sessions_from_a_command_line_string_and_an_exits_file(tmp_path):
    path = tmp_path / "exits.txt"
    path.write_text(f"# gateway\n{GATEWAY}\n")
    exits = read_exits(Settings({"EXITLIMIT_EXITS": str(path), "EXITLIMIT_SESSIONS": "eu,us"}))
    assert [e.id.rsplit("~", 1)[1] for e in exits] == ["s=eu", "s=us"]


def test_exit_settings_can_name_a_session_by_its_id():
    exits = parse_exit_list([GATEWAY], ["1", "2"])
    c = config(EXITLIMIT_EXITS=[GATEWAY], EXITLIMIT_SESSIONS=2,
               EXITLIMIT_EXIT_SETTINGS={exits[1].id: {"concurrency": 1}})
    assert c.limits.exit_concurrency(exits[1].id) == 1
    assert c.limits.exit_concurrency(exits[0].id) == 8


def test_a_template_without_sessions_names_both_settings():
    with pytest.raises(ValueError, match="EXITLIMIT_EXITS.*EXITLIMIT_SESSIONS") as info:
        config(EXITLIMIT_EXITS=[GATEWAY])
    assert "hunter2" not in str(info.value)


@pytest.mark.parametrize("value", [0, -2, "x@y", ["a", "a"], 2.5, ["no/slash"]])
def test_bad_sessions_name_the_setting(value):
    with pytest.raises(ValueError, match="EXITLIMIT_SESSIONS"):
        config(EXITLIMIT_EXITS=[GATEWAY], EXITLIMIT_SESSIONS=value)


def test_sessions_without_a_template_warn(caplog):
    c = config(EXITLIMIT_EXITS=["http://127.0.0.1:9000"], EXITLIMIT_SESSIONS=3)
    assert len(c.exits) == 1
    assert "EXITLIMIT_SESSIONS is set but no EXITLIMIT_EXITS entry" in caplog.text
