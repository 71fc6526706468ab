"""Exit-keyed rate limiting for Scrapy crawls behind rotating proxy pools."""

from .addon import Addon
from .middleware import ExitLimitMiddleware

__all__ = ["Addon", "ExitLimitMiddleware"]
__version__ = "0.1.0"
