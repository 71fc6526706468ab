"""A deterministic simulator for the learner: the real core against model origins.

No sockets and no sleeping: ``python bench/sim.py`` prints every model's
utilization and 429 share; the test suite runs a short version of each.
"""

from .crawl import Crawl, Network, Result, simulate
from .origins import FixedWindow, Gcra, OriginModel, Scheduled, SlidingWindow, Unlimited
from .scenarios import SCENARIOS, Row, Scenario, format_table, run, table

__all__ = [
    "SCENARIOS",
    "Crawl",
    "FixedWindow",
    "Gcra",
    "Network",
    "OriginModel",
    "Result",
    "Row",
    "Scenario",
    "Scheduled",
    "SlidingWindow",
    "Unlimited",
    "format_table",
    "run",
    "simulate",
    "table",
]
