"""``scrapy exitlimit-state [FILE]``: what an EXITLIMIT_STATE_FILE holds."""

from __future__ import annotations

import argparse
import time

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

from ..state_file import SETTING, StateFileError, show

DEFAULT_MAX_AGE = 86400.0


class Command(ScrapyCommand):
    requires_project = False
    requires_crawler_process = False
    default_settings = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "[options] [FILE]"

    def short_desc(self) -> str:
        return "Show what an EXITLIMIT_STATE_FILE holds (warm start)"

    def long_desc(self) -> str:
        return ("Print the origins an EXITLIMIT_STATE_FILE remembers, with the per-IP and "
                "site rates learned for each (the pace that ran clean and the lowest that "
                "drew a 429), the exits that learned a rate of their own, and how long ago "
                "each was last used; entries older than EXITLIMIT_STATE_MAX_AGE are marked "
                "stale (a crawl ignores them). FILE is the project's EXITLIMIT_STATE_FILE "
                "when not given.")

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--max-age", metavar="SECONDS", type=float, default=None,
                            help="mark entries older than this stale (default the "
                                 "EXITLIMIT_STATE_MAX_AGE setting, else one day)")

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        assert self.settings is not None
        if len(args) > 1:
            raise UsageError("give one state file")
        path = args[0] if args else self.settings.get(SETTING)
        if not path:
            raise UsageError(f"give a state file, or set {SETTING}")
        try:
            max_age = opts.max_age if opts.max_age is not None else self.settings.getfloat(
                "EXITLIMIT_STATE_MAX_AGE", DEFAULT_MAX_AGE)
        except ValueError:
            raise UsageError("EXITLIMIT_STATE_MAX_AGE must be a number of seconds",
                             print_help=False) from None
        try:
            print(show(path, now=time.time(), max_age=max_age))
        except StateFileError as exc:
            print(f"{path}: {exc}")
            self.exitcode = 1
