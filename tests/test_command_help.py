"""Every command's --help reads right at any terminal width.

Scrapy's help formatter turns any help line ending in ':' into an underlined section
title, so a help text that happens to wrap just after a colon prints a broken heading.
"""

from __future__ import annotations

import argparse
import functools

import pytest
from scrapy.commands import ScrapyHelpFormatter
from scrapy.settings import Settings

from scrapy_exitlimit.commands import probe, report, state

HEADINGS = {"Usage", "Options", "Global Options"}


def help_text(command_cls: type, width: int) -> str:
    cmd = command_cls()
    cmd.settings = Settings()
    parser = argparse.ArgumentParser(
        formatter_class=functools.partial(ScrapyHelpFormatter, width=width),
        usage=f"scrapy exitlimit-x {cmd.syntax()}", conflict_handler="resolve",
        description=cmd.long_desc())
    cmd.add_options(parser)
    return parser.format_help()


def headings(text: str) -> list[str]:
    lines = text.splitlines()
    return [line for line, under in zip(lines, lines[1:], strict=False)
            if under and set(under) <= {"=", "-"} and len(under) == len(line)]


@pytest.mark.parametrize("command", [probe.Command, report.Command, state.Command],
                         ids=["probe", "report", "state"])
# below 50 columns Scrapy's own "-L" help breaks the same way ("(default: DEBUG)")
@pytest.mark.parametrize("width", [*range(50, 121), 200])
def test_help_has_only_its_own_headings(command, width):
    text = help_text(command, width)
    assert set(headings(text)) == HEADINGS, text


def test_probe_help_at_80_columns_names_the_setting_once_in_its_line():
    text = help_text(probe.Command, 80)
    assert "Proxy Urls" not in text  # what a broken heading looked like
    assert "EXITLIMIT_EXITS setting when not given" in " ".join(text.split())
