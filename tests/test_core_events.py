import json

import pytest

from scrapy_exitlimit.core import Event, EventKind


def test_an_event_kind_is_its_stat_name_wherever_it_is_written():
    ev = Event("rate_down", "http://site.test", None, "5 -> 2.5 r/s")  # given by its value
    assert ev.kind is EventKind.RATE_DOWN
    assert ev.kind == "rate_down" and "rate_down" in {ev.kind}
    assert f"exitlimit/{ev.kind}" == "exitlimit/rate_down" and str(ev.kind) == "rate_down"
    assert json.dumps(ev.kind) == '"rate_down"'


def test_an_unknown_event_kind_is_refused():
    with pytest.raises(ValueError):
        Event("rate_sideways", "http://site.test", None, "")
