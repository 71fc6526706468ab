"""Spiders of the distributed mode (they need scrapy-redis: pip install 'scrapy-exitlimit[redis]')."""
