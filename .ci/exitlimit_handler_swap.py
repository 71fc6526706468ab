"""pytest plugin: run Scrapy's own HTTP/1.1 download-handler tests against
scrapy_exitlimit's CredentialKeyedDownloadHandler (EXITLIMIT_SWAP_HANDLER=1) or, to
compare, against Scrapy's handler; reports how many downloads went through ours."""

from __future__ import annotations

import os

SWAP = os.environ.get("EXITLIMIT_SWAP_HANDLER") == "1"
_calls = [0]

if SWAP:
    import scrapy.core.downloader.handlers.http11 as http11

    from scrapy_exitlimit.handlers import CredentialKeyedDownloadHandler, _CredentialKeyedPool

    _get = _CredentialKeyedPool.getConnection

    def _counted(self, key, endpoint):  # every connection asked for through our pool
        _calls[0] += 1
        return _get(self, key, endpoint)

    _CredentialKeyedPool.getConnection = _counted
    http11.HTTP11DownloadHandler = CredentialKeyedDownloadHandler


def pytest_terminal_summary(terminalreporter) -> None:
    handler = "CredentialKeyedDownloadHandler" if SWAP else "Scrapy's HTTP11DownloadHandler"
    terminalreporter.write_line(
        f"handler under test: {handler}"
        + (f"; connections asked through its pool: {_calls[0]}" if SWAP else ""))
