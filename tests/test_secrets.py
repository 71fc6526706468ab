"""Must-show: proxy credentials appear in no log record (DEBUG, every logger), no stat, no
telemetry line, no report and no state file (EXITLIMIT_STATE_FILE)."""

from __future__ import annotations

import base64
import logging
from typing import Any
from urllib.parse import quote

import pytest
import pytest_twisted

from scrapy_exitlimit.lab import Lab, OriginConfig

from .crawling import crawl

USER = "cust-4711-zone-resi"
PASSWORD = "Pw9-fK3q~zX"
PAGES = 10


def secret_forms(user: str, password: str) -> list[str]:
    """Every shape the credentials could leak in."""
    forms = {user, password, quote(user, safe=""), quote(password, safe="")}
    for userinfo in (f"{user}:{password}", f"{quote(user, safe='')}:{quote(password, safe='')}"):
        forms.add(userinfo)
        forms.add(base64.b64encode(userinfo.encode()).decode())
    return sorted(forms)


class _Everything(logging.Handler):
    """Every record of every logger, rendered every way it could be written out."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.texts: list[str] = []
        self._formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")

    def emit(self, record: logging.LogRecord) -> None:
        self.texts.append(self._formatter.format(record))  # message, args, traceback
        self.texts.append(repr(vars(record)))  # extra={...}, raw args


def _plain(lab: Lab) -> tuple[dict[str, Any], list[str]]:
    return {"EXITLIMIT_EXITS": lab.exit_urls}, secret_forms(USER, PASSWORD)


def _sessions(lab: Lab) -> tuple[dict[str, Any], list[str]]:
    template = f"http://{USER}-session-{{session}}:{PASSWORD}@127.0.0.1:{lab.proxies[0].port}"
    forms = [f for s in ("1", "2", "3") for f in secret_forms(f"{USER}-session-{s}", PASSWORD)]
    return {"EXITLIMIT_EXITS": [template], "EXITLIMIT_SESSIONS": 3}, forms


SCENARIOS = {
    # credentialed exits: two working, one whose proxy refuses them (407), one dead
    "credentials": (
        lambda: Lab(exits=3, proxy_auth=(USER, PASSWORD), dead_exits=1,
                    proxy_kwargs={2: {"auth": ("someone", "else")}},
                    origin=OriginConfig(rate=8)),
        _plain,
    ),
    # three sessions on one gateway (one exit IP): the origin pushes back hard
    "gateway-sessions": (
        lambda: Lab(exits=1, origin=OriginConfig(rate=10)),
        _sessions,
    ),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest_twisted.ensureDeferred
async def test_credentials_are_in_no_log_record_no_stat_no_telemetry(scenario, tmp_path):
    make_lab, exit_settings = SCENARIOS[scenario]
    lab = make_lab()
    await lab.start()
    settings, forms = exit_settings(lab)
    telemetry = tmp_path / "telemetry.jsonl"
    state = tmp_path / "state.json"
    settings.update({"EXITLIMIT_TELEMETRY": str(telemetry), "EXITLIMIT_STATE_FILE": str(state),
                     "LOG_LEVEL": "DEBUG", "EXITLIMIT_DEBUG": True, "EXITLIMIT_RATE": 10,
                     "EXITLIMIT_STATS_PER_EXIT": True, "EXITLIMIT_MAX_RETRIES": 20,
                     # a 429 costs a pair 0.2 s, not the origin's Retry-After: 1
                     "EXITLIMIT_COOLDOWN_MIN": 0.05, "EXITLIMIT_COOLDOWN_MAX": 0.2})
    handler = _Everything()
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        origin = lab.origin_url
        crawler = await crawl(settings, origin, PAGES)
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
        await lab.stop()
    stats = crawler.stats.get_stats()
    assert len(crawler.spider.ok) == PAGES  # the credentials did reach the proxies
    # the paths that log exits all ran: admission, feedback, re-issue, proxy faults
    assert stats["exitlimit/response_429"] > 0 and stats["exitlimit/reissued"] > 0
    if scenario == "credentials":
        assert stats["exitlimit/proxy_fault"] > 0
    logged = "\n".join(handler.texts)
    assert "exitlimit" in logged and "~" in logged  # masked exit ids were logged
    dumped = repr(stats)
    assert "exitlimit/exit/" in dumped  # per-exit stats carry the masked ids
    recorded = telemetry.read_text()
    assert '"ev":"admit"' in recorded and '"ev":"response"' in recorded
    report = summarize_file(telemetry)
    assert "exit" in report
    # what was learned, kept for the next run (warm start): written when there is any
    kept = state.read_text() if state.exists() else ""
    shown = show_state(state) if kept else ""
    if scenario == "credentials":  # pairs that learned their own rate, by exit id
        assert origin in kept and '"pairs": {}' not in kept and "~" in kept and "~" in shown
    leaks = [(where, i) for i, form in enumerate(forms)
             for where, text in (("log", logged), ("stats", dumped), ("telemetry", recorded),
                                 ("report", report), ("state file", kept),
                                 ("exitlimit-state", shown)) if form in text]
    assert not leaks, f"credential forms (by index) found: {leaks}"


def show_state(path) -> str:
    import time

    from scrapy_exitlimit.state_file import show

    return show(path, now=time.time(), max_age=86400.0)


def summarize_file(path) -> str:
    from scrapy_exitlimit.report import load, summarize

    records, malformed = load(path)
    assert malformed == 0
    return summarize(records)
