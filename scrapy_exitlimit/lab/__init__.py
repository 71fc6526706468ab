"""A local lab for exercising exit-keyed rate limiting against real sockets.

One origin HTTP server rate-limits every client IP (GCRA, like nginx ``limit_req``) and
records what it saw; N HTTP forward proxies ("exits") each connect out from their own
loopback address (127.0.0.10, 127.0.0.11, ...), so the origin sees N distinct clients.
Everything stays on 127.0.0.0/8. Twisted only, and no reactor is imported at module level,
so importing the lab never installs one::

    lab = Lab(exits=3, origin=OriginConfig(rate=5))
    await lab.start()
    ...  # crawl lab.page_url(0) through lab.exit_urls
    print(lab.origin.stats())
    await lab.stop()

Run it standalone with ``python -m scrapy_exitlimit.lab --exits 10 --rate 5``.
"""

from __future__ import annotations

from .lab import Lab
from .origin import GCRA, INHERIT, FixedWindow, IPRule, Origin, OriginConfig, ScheduledAnswer
from .proxy import ForwardProxy

__all__ = ["Lab", "OriginConfig", "IPRule", "Origin", "ForwardProxy", "GCRA", "INHERIT",
           "FixedWindow", "ScheduledAnswer"]
