"""``scrapy exitlimit-report TELEMETRY [--plot OUT.png]``."""

from __future__ import annotations

import argparse

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

from .. import report


class Command(ScrapyCommand):
    requires_project = False
    requires_crawler_process = False
    default_settings = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "[options] TELEMETRY"

    def short_desc(self) -> str:
        return "Summarize (and plot) an EXITLIMIT_TELEMETRY file"

    def long_desc(self) -> str:
        return ("Print requests, answers by status, 429 share, request rates, pair rates "
                "and waits per exit and per origin from an EXITLIMIT_TELEMETRY file; "
                "with --plot, also draw the pool and its exits, those in trouble first "
                "(needs scrapy-exitlimit[plot]).")

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        report.add_arguments(parser)

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        if len(args) != 1:
            raise UsageError("give one telemetry file")
        self.exitcode = report.run(args[0], opts.plot)
