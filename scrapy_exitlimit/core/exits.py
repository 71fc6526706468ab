"""Exit identity: the proxy URL is the exit; only a masked id ever leaves this module.

Exit ids (logs, stats, download slots, ``meta['exitlimit_exit']``, shared-state keys):

- ``host:port`` for a proxy URL without credentials;
- ``host:port~<hash>`` for one with credentials, ``<hash>`` the first 10 hex digits of
  the SHA-256 of the whole URL: two credentials on one gateway are two exits;
- ``host:port~<hash>~s=<session>`` for an exit expanded from a gateway template
  (``http://user-session-{session}:pass@gw:7777``), ``<hash>`` that of the *template*:
  the sessions of one template share it and the session label tells them apart.

A scheme other than ``http`` prefixes the id (``socks5://host:port``). Neither the
password nor the user name is ever in an id (a gateway's user name often embeds the
customer id); session labels are, so do not use secrets as session names. Ids are
derived from the URL (and template) alone, so every process derives the same one.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

_SCHEMES = ("http", "https", "socks5", "socks5h", "socks4")
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


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def exit_id(url: str, template: str | None = None, session: str | None = None) -> str:
    """A stable id that tells exits apart without revealing credentials (module docstring).

    ``template`` and ``session``: the gateway template ``url`` was expanded from, and
    the session name it was expanded with.
    """
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    base = f"{host}:{parts.port}" if parts.port else host
    if parts.scheme not in ("http", ""):
        base = f"{parts.scheme}://{base}"
    if template is not None and session is not None:
        return f"{base}~{_digest(template)}~s={session}"
    if parts.username is None and parts.password is None:
        return base
    return f"{base}~{_digest(url)}"


def mask_url(url: str) -> str:
    """The URL with its user info replaced, safe for logs."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    netloc = "***@" + parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=netloc).geturl()


def make_exit(url: str, template: str | None = None, session: str | None = None) -> Exit:
    url = url.strip()
    parts = urlsplit(url)
    if parts.scheme not in _SCHEMES or not parts.hostname:
        raise ValueError(f"not a proxy URL: {mask_url(url)!r} (expected scheme://host:port)")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as exc:
        raise ValueError(f"bad port in proxy URL {mask_url(url)!r}") from exc
    return Exit(id=exit_id(url, template, session), url=url)


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


def parse_exit_list(urls: Sequence[str], sessions: Sequence[str] | None = None) -> list[Exit]:
    """Exits from URLs, gateway templates expanded once per session (:func:`expand_templates`);
    blank lines and ``#`` comments skipped; duplicates refused."""
    exits: list[Exit] = []
    seen: set[str] = set()
    for raw, template, session in expand_templates(urls, sessions):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        ex = make_exit(line, template, session)
        if ex.id in seen:
            raise ValueError(f"duplicate exit {ex.id}")
        seen.add(ex.id)
        exits.append(ex)
    return exits
