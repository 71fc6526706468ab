"""Exit identity: the proxy URL is the exit; only a masked id ever leaves this module."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from urllib.parse import urlsplit

_SCHEMES = ("http", "https", "socks5", "socks5h", "socks4")


@dataclass(frozen=True)
class Exit:
    """One upstream identity. ``url`` may carry credentials: never log it, log ``id``."""

    id: str
    url: str = field(repr=False)

    def __str__(self) -> str:
        return self.id


def exit_id(url: str) -> str:
    """A stable id that tells exits apart without revealing credentials.

    ``host:port`` when the URL has no credentials; otherwise ``host:port~hash``
    where the hash is of the whole URL, so two sessions on one gateway stay two
    exits, every process derives the same id, and the secret is not readable.
    """
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    base = f"{host}:{parts.port}" if parts.port else host
    if parts.scheme not in ("http", ""):
        base = f"{parts.scheme}://{base}"
    if parts.username is None and parts.password is None:
        return base
    digest = hashlib.sha256(url.encode()).hexdigest()[:10]
    return f"{base}~{digest}"


def mask_url(url: str) -> str:
    """The URL with its user info replaced, safe for logs."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    netloc = "***@" + parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=netloc).geturl()


def make_exit(url: str) -> Exit:
    url = url.strip()
    parts = urlsplit(url)
    if parts.scheme not in _SCHEMES or not parts.hostname:
        raise ValueError(f"not a proxy URL: {mask_url(url)!r} (expected scheme://host:port)")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as exc:
        raise ValueError(f"bad port in proxy URL {mask_url(url)!r}") from exc
    return Exit(id=exit_id(url), url=url)


def parse_exit_list(urls: list[str]) -> list[Exit]:
    """Exits from URLs; blank lines and ``#`` comments skipped; duplicates refused."""
    exits: list[Exit] = []
    seen: set[str] = set()
    for raw in urls:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        ex = make_exit(line)
        if ex.id in seen:
            raise ValueError(f"duplicate exit {ex.id}")
        seen.add(ex.id)
        exits.append(ex)
    return exits
