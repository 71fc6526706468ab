"""Spiders of the distributed mode: they need scrapy-redis (the `redis` extra)."""
