"""Scrapy commands, registered as ``scrapy.commands`` entry points; they work outside a project.

- ``scrapy exitlimit-report TELEMETRY [--plot OUT.png]``: summarize an EXITLIMIT_TELEMETRY file
- ``scrapy exitlimit-probe URL --exits EXITS``: find each exit's concurrency knee
"""
