"""``EXITLIMIT_STATE_FILE``: what was learned, kept between runs (warm start).

The next run against an origin starts at the rates learned before: no discovery,
no slow start, no burst of 429s (``core/warm.py`` says what is kept and how it
is recalled). The file is JSON::

    {"format": "scrapy-exitlimit state", "version": 1, "written": 1718000000.0,
     "origins": {"https://site.example": {
         "at": 1718000000.0,
         "pool": {"clean": 4.9, "ceiling": 5.1, "seen": 5.1, "settled": true, "drift": 0.001},
         "site": null,
         "pairs": {"proxy1:8000~3f2a9c01b4d7": {"at": 1717999990.0, "own": {"clean": 0.95,
                   "ceiling": 1.02, "seen": 1.02, "settled": true, "drift": 0.005}}}}},
     "scopes": {}}

``at``: when the origin (pair) was last used, wall-clock seconds; ``clean``: the
rate seen clean, requests/s; ``ceiling``: the lowest that drew a 429 (null: none
yet). Pairs are keyed by exit id (an HMAC, never the proxy's credentials).
Readers ignore keys they do not know; ``version`` changes only when a known key
changes meaning. ``scopes``: the learned rate of each named scope (an account, an API
key) once proven, by scope id (``scope~<hmac>``, never the name), as
``{"scope~3f2a9c01b4d7": {"at": 1718000000.0, "rate": {"clean": 3.9, ...}}}``; a scope
with a configured rate (``EXITLIMIT_SCOPES``) has nothing kept.

It is read at start, and written at close and every ``EXITLIMIT_STATE_SAVE_INTERVAL``
seconds, atomically (a temporary file in the same directory, then ``os.replace``),
merged with what the file holds then (the newer entry wins, per origin and per
pair and per scope; entries older than ``EXITLIMIT_STATE_MAX_AGE`` are dropped), so crawls of
other sites sharing the file keep theirs. Several processes may share the file: each
read-merge-write holds an advisory lock (``flock``) on ``<name>.lock`` beside it, so
no save drops what another one added; a save that cannot have the lock within
``LOCK_TIMEOUT`` seconds is skipped with a warning, and the next one tries again. Where
there is no ``fcntl`` (Windows) saves are not locked. A file that cannot be used
(corrupt, unreadable, another program's, a newer version) is a warning naming the
setting, never an error, and stays as it is until there is learned state to write; it
is then kept beside the new one as ``<name>.unreadable``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

try:
    import fcntl
except ImportError:  # Windows: saves are not serialized between processes
    fcntl = None  # type: ignore[assignment]

from .core.limiter import Limiter
from .core.warm import Recalled, recall, recall_scopes, remember, remember_scopes

logger = logging.getLogger(__name__)

SETTING = "EXITLIMIT_STATE_FILE"
FORMAT = "scrapy-exitlimit state"
VERSION = 1
#: files larger than this are not read (a state file holds a few KB per origin)
MAX_BYTES = 64 << 20
#: seconds a save waits for another process's save to finish; saves run on the reactor
#: thread, so the wait is short, and a save that gives up leaves it to the next one
LOCK_TIMEOUT = 2.0
#: seconds between tries for the lock
LOCK_POLL = 0.01

Origins = dict[str, dict[str, Any]]
#: scope id -> {"at", "rate"}: learned rates of named scopes (accounts, API keys)
Scopes = dict[str, dict[str, Any]]


class Learned(NamedTuple):
    """What a state file holds."""

    origins: Origins
    scopes: Scopes


class StateFileError(ValueError):
    """The file cannot be used as a state file (the message says why)."""


# -- reading -----------------------------------------------------------------------------
def parse(text: str) -> tuple[Origins, float | None]:
    """(origins, when written) from a state file's text; StateFileError if unusable."""
    learned, written = parse_learned(text)
    return learned.origins, written


def parse_learned(text: str) -> tuple[Learned, float | None]:
    """(origins and scopes, when written) from a state file's text; StateFileError if
    unusable."""
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise StateFileError(f"not valid JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise StateFileError("not a scrapy-exitlimit state file")
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise StateFileError(f"bad version {_short(version)}")
    if version > VERSION:
        raise StateFileError(f"written by a newer scrapy-exitlimit (format version {version}, "
                             f"this one reads {VERSION})")
    origins = data.get("origins")
    if not isinstance(origins, dict):
        raise StateFileError("no origins table")
    scopes = data.get("scopes") or {}
    if not isinstance(scopes, dict):
        raise StateFileError("scopes is not a table")
    written = data.get("written")
    return (Learned(parse_origins(origins), parse_scopes(scopes)),
            _time(written, "written") if written is not None else None)


def parse_origins(origins: Mapping[str, Any]) -> Origins:
    """The origins table of a state file, checked (StateFileError when it is broken)."""
    out = {}
    for origin, entry in origins.items():
        where = f"origin {_short(origin)}"
        if not isinstance(entry, dict):
            raise StateFileError(f"{where}: not a table")
        pairs = entry.get("pairs") or {}
        if not isinstance(pairs, dict):
            raise StateFileError(f"{where}: pairs is not a table")
        out[origin] = {
            "at": _time(entry.get("at"), f"{where}: at"),
            "pool": _estimate(entry.get("pool"), f"{where}: pool", optional=True),
            "site": _estimate(entry.get("site"), f"{where}: site", optional=True),
            "pairs": {exit_id: _pair(pair, f"{where}, pair {_short(exit_id)}")
                      for exit_id, pair in pairs.items()},
        }
    return out


def parse_scopes(scopes: Mapping[str, Any]) -> Scopes:
    """The scopes table of a state file, checked (StateFileError when it is broken)."""
    out = {}
    for scope_id, entry in scopes.items():
        where = f"scope {_short(scope_id)}"
        if not isinstance(entry, dict):
            raise StateFileError(f"{where}: not a table")
        out[scope_id] = {"at": _time(entry.get("at"), f"{where}: at"),
                         "rate": _estimate(entry.get("rate"), f"{where}: rate")}
    return out


def _pair(pair: Any, where: str) -> dict[str, Any]:
    if not isinstance(pair, dict):
        raise StateFileError(f"{where}: not a table")
    return {"at": _time(pair.get("at"), f"{where}: at"),
            "own": _estimate(pair.get("own"), f"{where}: own")}


def _estimate(value: Any, where: str, optional: bool = False) -> dict[str, Any] | None:
    if value is None and optional:
        return None
    if not isinstance(value, dict):
        raise StateFileError(f"{where}: not a table")
    out = {"clean": _rate(value.get("clean"), f"{where}: clean")}
    for key in ("ceiling", "seen"):
        out[key] = None if value.get(key) is None else _rate(value[key], f"{where}: {key}")
    settled = value.get("settled", False)
    if not isinstance(settled, bool):
        raise StateFileError(f"{where}: settled must be true or false")
    out["settled"] = settled
    drift = value.get("drift")
    if drift is not None and (not _is_number(drift) or not 0 <= drift < 1):
        raise StateFileError(f"{where}: drift must be a number in [0, 1)")
    out["drift"] = drift
    return out


def _rate(value: Any, where: str) -> float:
    if not _is_number(value) or not 0 < value < 1e9:
        raise StateFileError(f"{where} must be a rate > 0, got {_short(value)}")
    return float(value)


def _time(value: Any, where: str) -> float:
    if not _is_number(value) or not 0 <= value < 1e11:
        raise StateFileError(f"{where} must be a time (unix seconds), got {_short(value)}")
    return float(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def read(path: str | os.PathLike) -> Origins:
    """The origins a state file holds; {} when there is no file yet; StateFileError when
    it cannot be used (unreadable, corrupt, foreign)."""
    return read_learned(path).origins


def read_learned(path: str | os.PathLike) -> Learned:
    """What a state file holds (empty when there is no file yet); StateFileError when it
    cannot be used (unreadable, corrupt, foreign)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return Learned({}, {})
    except (OSError, ValueError) as exc:  # permissions, a directory, a NUL in the path
        raise StateFileError(f"cannot be read ({_reason(exc)})") from None
    if len(raw) > MAX_BYTES:
        raise StateFileError(f"larger than {MAX_BYTES >> 20} MB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise StateFileError("not UTF-8 text") from None
    return parse_learned(text)[0]


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or type(exc).__name__


# -- writing -----------------------------------------------------------------------------
def merge(old: Mapping[str, Mapping[str, Any]], new: Mapping[str, Mapping[str, Any]], *,
          now: float, max_age: float) -> Origins:
    """``old`` and ``new`` together: per origin and per pair the newer entry wins; what
    is older than ``max_age`` goes."""
    out: Origins = {}
    for origin in {**old, **new}:
        a, b = old.get(origin), new.get(origin)
        newer = b if a is None or (b is not None and b["at"] >= a["at"]) else a
        older = a if newer is b else b
        pairs = dict(older["pairs"]) if older is not None else {}
        for exit_id, pair in newer["pairs"].items():
            if exit_id not in pairs or pair["at"] >= pairs[exit_id]["at"]:
                pairs[exit_id] = pair
        pairs = {k: p for k, p in pairs.items() if now - p["at"] <= max_age}
        if now - newer["at"] > max_age and not pairs:
            continue
        out[origin] = {**newer, "pairs": dict(sorted(pairs.items()))}
    return dict(sorted(out.items()))


def merge_scopes(old: Mapping[str, Mapping[str, Any]], new: Mapping[str, Mapping[str, Any]],
                 *, now: float, max_age: float) -> Scopes:
    """``old`` and ``new`` together: per scope the newer entry wins; what is older than
    ``max_age`` goes."""
    out = {}
    for scope_id in {**old, **new}:
        a, b = old.get(scope_id), new.get(scope_id)
        newer = b if a is None or (b is not None and b["at"] >= a["at"]) else a
        if now - newer["at"] <= max_age:
            out[scope_id] = dict(newer)
    return dict(sorted(out.items()))


def dump(origins: Mapping[str, Any], written: float,
         scopes: Mapping[str, Any] | None = None) -> str:
    return json.dumps({"format": FORMAT, "version": VERSION, "written": round(written, 3),
                       "origins": origins, "scopes": scopes or {}},
                      indent=1, allow_nan=False) + "\n"


def write(path: str | os.PathLike, text: str) -> None:
    """Atomically: a temporary file beside it, flushed to disk, then renamed over it."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def lock_path(path: str | os.PathLike) -> Path:
    """The lock file serializing saves of the state file ``path``. Not the state file
    itself: that is replaced at every write, and a lock on it would lock the old inode."""
    path = Path(path)
    return path.with_name(path.name + ".lock")


@contextlib.contextmanager
def locked(path: str | os.PathLike, timeout: float) -> Iterator[bool]:
    """Holds the exclusive lock on ``path`` (created if missing, never deleted: deleting
    a lock file another process has open races); yields False if it was not had within
    ``timeout`` seconds. OSError when the lock file cannot be opened."""
    if fcntl is None:
        yield True
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        yield _lock(fd, timeout)
    finally:
        os.close(fd)  # which releases the lock


def _lock(fd: int, timeout: float) -> bool:
    """Tries for the lock until ``timeout``: saves run on the reactor thread, so the wait
    is bounded (another process holds the lock only for its own read-merge-write)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(LOCK_POLL)


# -- the component -----------------------------------------------------------------------
class StateFile:
    """Reads the learned state into a limiter at start, writes it back now and then."""

    def __init__(self, path: str | os.PathLike, *, save_interval: float, max_age: float,
                 wall: Callable[[], float] = time.time,
                 lock_timeout: float = LOCK_TIMEOUT) -> None:
        self.path = Path(path)
        self.lock_path = lock_path(self.path)
        self.lock_timeout = lock_timeout
        self.save_interval = save_interval
        self.max_age = max_age
        self.wall = wall
        #: why the file on disk cannot be used, while it cannot (it is kept until a good
        #: state is written)
        self.problem: str | None = None
        self.saved_at = wall()

    def __repr__(self) -> str:
        return f"<StateFile {str(self.path)!r}>"

    def load(self, limiter: Limiter) -> Recalled | None:
        """Start ``limiter`` from the file (None: no file yet, or one that cannot be used)."""
        try:
            learned = read_learned(self.path)
        except StateFileError as exc:
            self._unusable(str(exc), "starting without it")
            return None
        self.problem = None
        if not learned.origins and not learned.scopes:
            return None
        wall = self.wall()
        got = recall(limiter, learned.origins, wall_now=wall, max_age=self.max_age)
        recall_scopes(limiter, learned.scopes, got, wall_now=wall, max_age=self.max_age)
        logger.info("exitlimit: warm start from %s (%s): %s", self.path, SETTING, describe(got))
        return got

    def due(self) -> bool:
        return self.save_interval > 0 and self.wall() - self.saved_at >= self.save_interval

    def save(self, limiter: Limiter) -> bool:
        """Write what the limiter learned, merged with the file; True when written.
        Another process's save in progress is waited for, up to ``lock_timeout``: two
        read-merge-writes at once would each drop what the other one added."""
        now = self.wall()
        self.saved_at = now
        offset = now - limiter.clock()
        ours = Learned(remember(limiter, offset), remember_scopes(limiter, offset))
        if not ours.origins and not ours.scopes and not self.path.exists():
            return False  # nothing to say, and no file to bring up to date
        try:
            with locked(self.lock_path, self.lock_timeout) as held:
                if not held:
                    logger.warning("exitlimit: %s (%s) is being saved by another process "
                                   "(%s held for over %gs): this save is skipped, the next "
                                   "one tries again", SETTING, self.path, self.lock_path.name,
                                   self.lock_timeout)
                    return False
                return self._merge_and_write(ours, now)
        except (OSError, ValueError) as exc:  # the lock file or the state file
            logger.warning("exitlimit: %s (%s) cannot be written: %s", SETTING, self.path,
                           _reason(exc))
            return False

    def _merge_and_write(self, ours: Learned, now: float) -> bool:
        """The read-merge-write of ``save``, under the lock; OSError when not written."""
        try:
            disk = read_learned(self.path)
            self.problem = None
        except StateFileError as exc:
            if not ours.origins and not ours.scopes:
                return False  # nothing learned: the file stays as it is
            disk = Learned({}, {})
            self._unusable(str(exc), "writing the state learned in this run over it")
            self._keep_aside()
        origins = merge(disk.origins, ours.origins, now=now, max_age=self.max_age)
        scopes = merge_scopes(disk.scopes, ours.scopes, now=now, max_age=self.max_age)
        if not origins and not scopes and not self.path.exists():
            return False  # all of it too old, and no file to bring up to date
        write(self.path, dump(origins, now, scopes))
        return True

    def _unusable(self, why: str, what: str) -> None:
        if self.problem != why:
            logger.warning("exitlimit: %s (%s) cannot be used, %s: %s", SETTING, self.path,
                           why, what)
        self.problem = why

    def _keep_aside(self) -> None:
        if not self.path.is_file():  # a directory named by mistake stays where it is
            return
        aside = self.path.with_name(self.path.name + ".unreadable")
        try:
            os.replace(self.path, aside)
        except FileNotFoundError:
            return
        except OSError as exc:
            logger.warning("exitlimit: %s (%s) cannot be kept aside as %s: %s", SETTING,
                           self.path, aside.name, _reason(exc))
            return
        logger.warning("exitlimit: the unusable %s is kept as %s", SETTING, aside)


def describe(got: Recalled) -> str:
    parts = [f"{len(got.origins)} origin(s)", f"{got.pairs} pair(s) with a rate of their own"]
    if got.scopes:
        parts.append(f"{got.scopes} learned scope rate(s)")
    if got.stale_origins or got.stale_pairs or got.stale_scopes:
        parts.append(f"ignored as older than EXITLIMIT_STATE_MAX_AGE: {got.stale_origins} "
                     f"origin(s), {got.stale_pairs} pair(s)"
                     + (f", {got.stale_scopes} scope(s)" if got.stale_scopes else ""))
    if got.gone_pairs:
        parts.append(f"{got.gone_pairs} pair(s) of exits no longer in the pool dropped")
    return "; ".join(parts)


# -- showing it -------------------------------------------------------------------------
def show(path: str | os.PathLike, *, now: float, max_age: float) -> str:
    """What a state file holds, for people: origins, their rates, pairs, learned scopes
    (by id: scope names may be secrets), ages."""
    try:
        with open(path, encoding="utf-8") as f:
            (origins, scopes), written = parse_learned(f.read())
    except FileNotFoundError:
        raise StateFileError("does not exist") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        if isinstance(exc, StateFileError):
            raise
        raise StateFileError(f"cannot be read ({_reason(exc)})") from None
    head = f"{path}: format version {VERSION}"
    if written is not None:
        head += f", written {_age(now - written)} ago"
    lines = [head, f"{len(origins)} origin(s), {len(scopes)} learned scope(s); entries older "
             f"than {_age(max_age)} (EXITLIMIT_STATE_MAX_AGE) are ignored at start", ""]
    if not origins and not scopes:
        return "\n".join(lines[:2])
    lines.append(f"{'origin / exit':<44} {'age':>7}  {'per-IP r/s':<22} {'site r/s':<22}")
    for origin, entry in origins.items():
        stale = " (stale)" if now - entry["at"] > max_age else ""
        lines.append(f"{_cut(origin, 44):<44} {_age(now - entry['at']):>7}  "
                     f"{_rates(entry['pool']):<22} {_rates(entry['site']):<22}{stale}")
        for exit_id, pair in entry["pairs"].items():
            stale = " (stale)" if now - pair["at"] > max_age else ""
            lines.append(f"  {_cut(exit_id, 42):<42} {_age(now - pair['at']):>7}  "
                         f"{_rates(pair['own']):<22} {'(its own)':<22}{stale}")
    if scopes:
        lines.append(f"{'scope':<44} {'age':>7}  {'r/s':<22}")
    for scope_id, entry in scopes.items():
        stale = " (stale)" if now - entry["at"] > max_age else ""
        lines.append(f"{_cut(scope_id, 44):<44} {_age(now - entry['at']):>7}  "
                     f"{_rates(entry['rate']):<22}{stale}")
    lines += ["", "r/s: clean (the pace that ran clean) / ceiling (the lowest that drew a "
              "429); -: not limited, or not learned"]
    return "\n".join(line.rstrip() for line in lines)


def _rates(est: Mapping[str, Any] | None) -> str:
    if est is None:
        return "-"
    ceiling = est.get("seen") or est.get("ceiling")
    return f"{est['clean']:.3g}" + (f" / {ceiling:.3g}" if ceiling else " / -")


def _age(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


__all__ = ["FORMAT", "LOCK_TIMEOUT", "SETTING", "VERSION", "Learned", "StateFile",
           "StateFileError", "dump", "lock_path", "locked", "merge", "merge_scopes", "parse",
           "parse_learned", "parse_origins", "parse_scopes", "read", "read_learned", "show",
           "write"]
