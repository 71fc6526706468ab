"""Exit identity: the proxy URL is the exit; only a masked id ever leaves this module.

Exit ids (logs, stats, download slots, ``meta['exitlimit_exit']``, shared-state keys):

- ``host:port`` for a proxy URL without credentials;
- ``host:port~<hash>`` for one with credentials, ``<hash>`` the first 12 hex digits of
  an HMAC-SHA-256 of the whole URL under the deployment's *id key*: two credentials on
  one gateway are two exits;
- ``host:port~<hash>~s=<session>`` for an exit expanded from a gateway template
  (``http://user-session-{session}:pass@gw:7777``), ``<hash>`` that of the *template*:
  the sessions of one template share it and the session label tells them apart.

A scheme other than ``http`` prefixes the id (``https://host:port``). Neither the
password nor the user name is ever in an id (a gateway's user name often embeds the
customer id); session labels are, so do not use secrets as session names.

Why keyed: an unkeyed hash of the URL would let anyone who reads a log and knows the
gateway and the user name test password guesses offline, billions a second, and
confirm a hit against the id. With the HMAC key unknown to the log reader, the id
confirms nothing. Processes that share the key (``EXITLIMIT_ID_KEY``, or the key file
``config.id_key`` falls back to) derive the same ids; without a key this module uses
one drawn at random per process: safe, but ids then differ between processes.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any
from urllib.parse import urlsplit

#: proxy schemes Scrapy's HTTP/1.1 download handler speaks (https: for http:// targets only)
SCHEMES = ("http", "https")
#: ``host:port`` or ``user:pass@host:port`` without a scheme: an http proxy
_NO_SCHEME = re.compile(r"(?:[^@/\s]+@)?(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):\d{1,5}")
#: hex digits of the HMAC kept in an id (48 bits: two exits of one pool never collide)
ID_HASH_DIGITS = 12
#: the key used when none is given: random per process, so never recomputable
_PROCESS_KEY = os.urandom(32)
#: where a gateway template takes the session name
SESSION_FIELD = "{session}"
#: session names go into URLs and ids as they are: unreserved URL characters only
_SESSION_NAME = re.compile(r"[A-Za-z0-9._~-]{1,64}")
MAX_SESSIONS = 10_000


@dataclass(frozen=True)
class Exit:
    """One upstream identity. ``url`` may carry credentials: never log it, log ``id``."""

    id: str
    url: str = field(repr=False)

    def __str__(self) -> str:
        return self.id

    @cached_property
    def address(self) -> str:
        """``scheme://host:port`` of the proxy, without credentials (safe to keep)."""
        return proxy_address(self.url)

    @cached_property
    def has_credentials(self) -> bool:
        parts = urlsplit(self.url)
        return parts.username is not None or parts.password is not None


@lru_cache(maxsize=4096)  # the download handler asks for every request
def proxy_address(url: str) -> str:
    """``scheme://host:port`` of a proxy URL (``host:port``: http), lower case, default
    ports filled in, credentials left out: two spellings of one proxy compare equal."""
    parts = urlsplit(with_scheme(url))
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    return f"{scheme}://{host}:{port or (443 if scheme == 'https' else 80)}"


def _digest(text: str, key: bytes | None) -> str:
    mac = hmac.new(_PROCESS_KEY if key is None else key, text.encode(), hashlib.sha256)
    return mac.hexdigest()[:ID_HASH_DIGITS]


def keyed_hash(text: str, key: bytes | None = None) -> str:
    """12 hex digits of an HMAC of ``text`` under the id key (None: this process's):
    what names a secret (a credential, a scope's name) where people can read it."""
    return _digest(text, key)


def exit_id(url: str, template: str | None = None, session: str | None = None, *,
            key: bytes | None = None) -> str:
    """An id that tells exits apart without revealing credentials (module docstring).

    ``template`` and ``session``: the gateway template ``url`` was expanded from, and
    the session name it was expanded with. ``key``: the deployment's id key (None: this
    process's random one).
    """
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    base = f"{host}:{parts.port}" if parts.port else host
    if parts.scheme not in ("http", ""):
        base = f"{parts.scheme}://{base}"
    if template is not None and session is not None:
        return f"{base}~{_digest(template, key)}~s={session}"
    if parts.username is None and parts.password is None:
        return base
    return f"{base}~{_digest(url, key)}"


def mask_url(url: str) -> str:
    """The URL with its user info replaced, safe for logs."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    netloc = "***@" + parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=netloc).geturl()


def with_scheme(line: str) -> str:
    """``host:port`` (or ``user:pass@host:port``) means ``http://host:port``, as in
    scrapy-rotating-proxies; anything else is returned as it is."""
    line = line.strip()
    return f"http://{line}" if "://" not in line and _NO_SCHEME.fullmatch(line) else line


def make_exit(url: str, template: str | None = None, session: str | None = None, *,
              key: bytes | None = None) -> Exit:
    """An exit from a proxy URL (``host:port`` means ``http://host:port``).

    Errors never echo the URL: it may carry a password, and its user name a customer id.
    """
    url = with_scheme(url)
    if template is not None:
        template = with_scheme(template)
    parts = urlsplit(url)
    if "://" in url and parts.scheme and parts.scheme.lower() not in SCHEMES:
        raise ValueError(f"scheme {parts.scheme[:10]!r} is not supported: Scrapy's HTTP "
                         f"download handler speaks {' and '.join(SCHEMES)} proxies only")
    if parts.scheme.lower() not in SCHEMES or not parts.hostname:
        raise ValueError("not a proxy URL (expected scheme://host:port or host:port)")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise ValueError("bad port in proxy URL") from None
    return Exit(id=exit_id(url, template, session, key=key), url=url)


def is_template(line: str) -> bool:
    """A (non-comment) exit line with a ``{session}`` field."""
    line = line.strip()
    return SESSION_FIELD in line and not line.startswith("#")


def parse_sessions(value: Any) -> list[str] | None:
    """Session names: a count N (``5`` or ``"5"``: sessions ``1`` .. ``N``), a list of
    names, or a comma/space separated string of them; None when unset.

    Error messages read after the setting's name: ``EXITLIMIT_SESSIONS (0) must be ...``.
    """
    if value is None or value == "" or (isinstance(value, (list, tuple)) and not value):
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, int) and not isinstance(value, bool):
        if not 1 <= value <= MAX_SESSIONS:
            raise ValueError(f"({value!r}) must be between 1 and {MAX_SESSIONS}")
        return [str(i) for i in range(1, value + 1)]
    if isinstance(value, str):
        value = value.replace(",", " ").split()
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"({value!r}) must be a count of sessions or a list of session names")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, (str, int)):
            raise ValueError(f"names must be strings, got {type(item).__name__}")
    names = [str(item).strip() for item in value]
    bad = next((i for i, n in enumerate(names) if not _SESSION_NAME.fullmatch(n)), None)
    if bad is not None:  # not echoed: a misplaced URL there may carry credentials
        raise ValueError(f"names must be 1-64 of A-Z a-z 0-9 . _ ~ -; name #{bad + 1} is not")
    if len(set(names)) != len(names):
        raise ValueError("names must be unique")
    if len(names) > MAX_SESSIONS:
        raise ValueError(f"must name at most {MAX_SESSIONS} sessions")
    return names


def expand_templates(urls: Sequence[str], sessions: Sequence[str] | None
                     ) -> list[tuple[str, str | None, str | None]]:
    """``(url, template, session)`` per exit line: a line with ``{session}`` once per
    session (``template`` and ``session`` set), any other line as it is (both None).
    Blank lines and comments pass through; a template without sessions is refused."""
    out: list[tuple[str, str | None, str | None]] = []
    for raw in urls:
        if not is_template(raw):
            out.append((raw, None, None))
            continue
        template = raw.strip()
        if not sessions:
            raise ValueError(f"{mask_url(template)!r} has a {SESSION_FIELD} field but no "
                             "sessions are given")
        out.extend((template.replace(SESSION_FIELD, name), template, name) for name in sessions)
    return out


def parse_exit_list(urls: Sequence[str], sessions: Sequence[str] | None = None, *,
                    key: bytes | None = None) -> list[Exit]:
    """Exits from URLs, gateway templates expanded once per session (:func:`expand_templates`);
    blank lines and ``#`` comments skipped; duplicates refused. An error names the
    entry by its position (``entry #3``), never by its text."""
    exits: list[Exit] = []
    seen: set[str] = set()
    position = 0
    last: str | None = None
    for raw, template, session in expand_templates(urls, sessions):
        if template is None or template != last:
            position += 1  # the sessions of one template are one entry
        last = template
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            ex = make_exit(line, template, session, key=key)
        except ValueError as exc:
            raise ValueError(f"entry #{position}: {exc}") from None
        if ex.id in seen:
            raise ValueError(f"entry #{position}: duplicate exit {ex.id}")
        seen.add(ex.id)
        exits.append(ex)
    return exits
