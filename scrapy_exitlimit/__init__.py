"""Exit-keyed rate limiting for Scrapy crawls behind rotating proxy pools."""

from .addon import Addon
from .config import NoExits
from .failclosed import ProxyLost
from .middleware import ExitLimitMiddleware

__all__ = ["Addon", "ExitLimitMiddleware", "NoExits", "ProxyLost"]
__version__ = "0.1.0"
