"""An ordinary Scrapy project that crawls through a proxy pool with scrapy_exitlimit."""

import os

BOT_NAME = "example"
SPIDER_MODULES = ["example.spiders"]
NEWSPIDER_MODULE = "example.spiders"
ROBOTSTXT_OBEY = False
TELNETCONSOLE_ENABLED = False

# The one line that turns scrapy_exitlimit on.
ADDONS = {"scrapy_exitlimit.Addon": 100}

# The pool: a list of proxy URLs, or a file with one per line (credentials allowed,
# they are never logged). `python -m scrapy_exitlimit.demo` passes the lab's exits.
EXITLIMIT_EXITS = os.environ.get("EXITLIMIT_EXITS", "exits.txt")

# What the origin allows each exit IP (leave it unset to have it learned from the
# server's 429s), and at most how many requests one exit carries at once.
EXITLIMIT_RATE = 5
EXITLIMIT_CONCURRENCY = 8
