"""``scrapy exitlimit-probe URL --exits EXITS [--levels 1,2,4,...] [--requests-per-level N]``."""

from __future__ import annotations

import argparse

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError
from w3lib.url import is_url

from ..config import id_key, read_exit_urls
from ..core.exits import parse_exit_list
from ..probe import (
    DEFAULT_LEVELS,
    DEFAULT_REQUESTS_PER_LEVEL,
    LevelResult,
    ProbeSpider,
    analyze,
    format_verdicts,
    parse_levels,
)


class Command(ScrapyCommand):
    requires_project = False
    default_settings = {"LOG_LEVEL": "INFO"}

    def syntax(self) -> str:
        return "[options] URL --exits EXITS"

    def short_desc(self) -> str:
        return "Find each exit's concurrency knee and suggest EXITLIMIT_EXIT_SETTINGS"

    def long_desc(self) -> str:
        return ("Send requests to URL through each exit at rising concurrency levels, "
                "timing each answer until its body is complete; report per level the "
                "median / p95 time, 429s, errors and answers per second; stop an exit where "
                "it saturates (more in flight, no more answers per second), fails, or is "
                "rate-limited (429s: the target's limit, not the exit's capacity), and print "
                "EXITLIMIT_EXIT_SETTINGS with the concurrency each exit kept in service. "
                "EXITS are proxy URLs, comma-separated, or a file with one per line, by "
                "default the EXITLIMIT_EXITS setting.")

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--exits", metavar="EXITS", default=None,
                            help="proxy URLs, comma-separated, or a file with one per "
                                 "line; the EXITLIMIT_EXITS setting when not given")
        parser.add_argument("--levels", metavar="1,2,4,...",
                            default=",".join(map(str, DEFAULT_LEVELS)),
                            help="concurrency levels to walk (default %(default)s)")
        parser.add_argument("--requests-per-level", metavar="N", type=int,
                            default=DEFAULT_REQUESTS_PER_LEVEL,
                            help="requests per level, at least 2 x level "
                                 "(default %(default)s)")

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        if len(args) != 1 or not is_url(args[0]):
            raise UsageError("give one URL to probe")
        assert self.settings is not None and self.crawler_process is not None
        try:
            levels = parse_levels(opts.levels)
            source = opts.exits if opts.exits is not None else self.settings.get(
                "EXITLIMIT_EXITS")
            name = "--exits" if opts.exits is not None else "EXITLIMIT_EXITS"
            urls = read_exit_urls(source, name)
        except ValueError as exc:
            raise UsageError(str(exc), print_help=False) from None
        try:  # the ids a crawl with these settings uses (same key)
            exits = parse_exit_list(urls, key=id_key(self.settings))
        except ValueError as exc:
            raise UsageError(f"{name} {exc}", print_help=False) from None
        if not exits:
            raise UsageError("no exits: give --exits or set EXITLIMIT_EXITS", print_help=False)
        if opts.requests_per_level < 1:
            raise UsageError("--requests-per-level must be >= 1", print_help=False)
        results: list[LevelResult] = []
        self.crawler_process.crawl(ProbeSpider, url=args[0], exits=exits, levels=levels,
                                   requests_per_level=opts.requests_per_level,
                                   results=results)
        self.crawler_process.start()
        if self.crawler_process.bootstrap_failed:
            self.exitcode = 1
            return
        verdicts = [analyze(ex.id, [r for r in results if r.exit_id == ex.id])
                    for ex in exits]
        print(format_verdicts(verdicts, args[0]))
