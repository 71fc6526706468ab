"""What an answer means for the limiter: the default classification, replaceable by setting.

    EXITLIMIT_POLICY = "myproject.policies.MyPolicy"   # subclass ResponsePolicy
"""

from __future__ import annotations

import re
from enum import Enum
from typing import TYPE_CHECKING

from twisted.internet import error as net_error
from twisted.web.client import ResponseFailed, ResponseNeverReceived

from ._compat import download_exceptions

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.http import Response


class Signal(Enum):
    OK = "ok"  # clean: 2xx/3xx, and ordinary client errors (404, 410...)
    RATE_LIMITED = "rate_limited"  # 429: the pair's limit
    OVERLOADED = "overloaded"  # 503: the origin as a whole
    BANNED = "banned"  # 403 / block page / captcha: this exit, for this origin
    PROXY_FAULT = "proxy_fault"  # the exit itself failed
    OTHER = "other"  # says nothing about limits (e.g. a 500, a DNS error)


_BLOCK_MARKERS = re.compile(
    rb"captcha|access denied|attention required|are you a robot|unusual traffic"
    rb"|request blocked|you have been blocked|verify you are (a )?human",
    re.IGNORECASE,
)
_TITLE = re.compile(rb"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)
_PROXY_EXCEPTIONS: tuple[type[BaseException], ...] = (
    net_error.ConnectionRefusedError,
    net_error.ConnectError,
    net_error.TCPTimedOutError,
    net_error.TimeoutError,
    net_error.ConnectionLost,
    net_error.ConnectionDone,
    ResponseNeverReceived,
    ResponseFailed,
    ConnectionRefusedError,
    ConnectionResetError,
    TimeoutError,
)


class ResponsePolicy:
    """The default reading of answers. Override a method to change one rule."""

    #: statuses a proxy or gateway answers in place of the origin
    proxy_fault_statuses = frozenset({407, 502, 504})
    #: how much of a body the block-page check reads
    sniff_bytes = 4096

    def classify_response(self, request: Request, response: Response) -> Signal:
        status = response.status
        if status == 429:
            return Signal.RATE_LIMITED
        if status in self.proxy_fault_statuses or "dataloss" in response.flags:
            return Signal.PROXY_FAULT  # a body cut off on the way counts as the path's fault
        if self.is_block_page(request, response):
            return Signal.BANNED
        if status == 503:
            return Signal.OVERLOADED
        if status >= 500:
            return Signal.OTHER
        return Signal.OK

    def is_block_page(self, request: Request, response: Response) -> bool:
        """403, or a 200/503 whose title says captcha / access denied."""
        if response.status == 403:
            return True
        if response.status not in (200, 503):
            return False
        head = response.body[: self.sniff_bytes]
        title = _TITLE.search(head)
        return bool(title and _BLOCK_MARKERS.search(title.group(1)))

    def classify_exception(self, request: Request, exception: BaseException) -> Signal:
        if isinstance(exception, _proxy_exceptions()):
            return Signal.PROXY_FAULT
        return Signal.OTHER


def _proxy_exceptions() -> tuple[type[BaseException], ...]:
    """Twisted's errors plus the ones newer Scrapy versions wrap them in."""
    from scrapy.core.downloader.handlers.http11 import TunnelError

    wrapped = download_exceptions("DownloadConnectionRefusedError", "DownloadTimeoutError",
                                  "DownloadFailedError", "ResponseDataLossError")
    return (TunnelError, *_PROXY_EXCEPTIONS, *wrapped)
