"""Exit ids and gateway templates: one exit per session, ids masked and stable."""

from __future__ import annotations

import hashlib
import hmac
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


KEY = b"a deployment's id key, shared"


def hmac12(text: str, key: bytes = KEY) -> str:
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()[:12]


def test_id_forms():
    assert exit_id("http://10.0.0.1:8000") == "10.0.0.1:8000"
    assert exit_id("https://10.0.0.1:8443") == "https://10.0.0.1:8443"
    url = "http://u:p@10.0.0.1:8000"
    assert exit_id(url, key=KEY) == "10.0.0.1:8000~" + hmac12(url)
    sessions = parse_exit_list([GATEWAY], ["1", "eu-7"], key=KEY)
    digest = hmac12(GATEWAY)
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


@pytest.mark.parametrize("values", [{}, {"EXITLIMIT_ID_KEY": "0123456789abcdef-shared"}],
                         ids=["key-file", "key-setting"])
def test_ids_are_the_same_in_another_process(values):
    """Another process on this machine (the key file) or anywhere (the key setting)."""
    values = {"EXITLIMIT_EXITS": [GATEWAY, "http://u:p@h:1"], "EXITLIMIT_SESSIONS": 2,
              **values}
    code = ("from scrapy.settings import Settings; "
            "from scrapy_exitlimit.config import read_exits; "
            f"print(*[e.id for e in read_exits(Settings({values!r}))])")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout.split()
    assert other == [e.id for e in read_exits(Settings(values))]
    assert len(set(other)) == 3


def test_an_id_cannot_be_recomputed_from_the_url_alone():
    """A log reader who knows the gateway and the user name, guessing the password:
    the unkeyed hash an id used to be confirms the right guess; without the key
    nothing does, not even the hash under the key the code falls back to."""
    url = "http://cust-4711:hunter2@gw.example:7777"
    key = b"0123456789abcdef-deployment"
    the_id = read_exits(Settings({"EXITLIMIT_EXITS": [url],
                                  "EXITLIMIT_ID_KEY": key.decode()}))[0].id
    shown = the_id.rpartition("~")[2]
    guesses = [url.replace("hunter2", guess) for guess in ("123456", "password", "hunter2")]
    for guess in guesses:  # what the old id was, and any unkeyed or default-keyed digest
        for digest in (hashlib.sha256(guess.encode()).hexdigest(),
                       hashlib.sha1(guess.encode()).hexdigest(),
                       hashlib.md5(guess.encode()).hexdigest(),
                       hmac.new(b"", guess.encode(), hashlib.sha256).hexdigest(),
                       exit_id(guess).rpartition("~")[2]):
            assert not digest.startswith(shown)
    # with the key, the right guess matches: the key is what keeps the id useless
    assert [exit_id(g, key=key) for g in guesses].count(the_id) == 1
    assert the_id == exit_id(guesses[2], key=key)


def test_the_key_file_is_made_once_private_and_kept(tmp_path, monkeypatch):
    from scrapy_exitlimit import config as config_module

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    first = config_module.id_key(Settings())
    path = config_module.id_key_path()
    assert path.is_file() and (path.stat().st_mode & 0o777) == 0o600
    assert config_module.id_key(Settings()) == first and len(first) >= 32
    assert config_module.id_key(Settings({"EXITLIMIT_ID_KEY": "x" * 16})) == b"x" * 16


@pytest.mark.parametrize("value", ["short", 12345678901234567890, ["k" * 20]])
def test_a_bad_id_key_names_the_setting(value):
    with pytest.raises(ValueError, match="EXITLIMIT_ID_KEY"):
        read_exits(Settings({"EXITLIMIT_EXITS": ["http://u:p@h:1"], "EXITLIMIT_ID_KEY": value}))


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
    exits = read_exits(Settings({"EXITLIMIT_EXITS": [GATEWAY], "EXITLIMIT_SESSIONS": 2}))
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
