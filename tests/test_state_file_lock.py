"""EXITLIMIT_STATE_FILE shared by several processes: their saves are serialized by a lock
file beside it, so none drops what another one added; a lock held too long skips a save
with a warning, never an error. Real processes and real locks."""

from __future__ import annotations

import logging
import multiprocessing
import os
import random
import threading
import time

import pytest

from scrapy_exitlimit import state_file
from scrapy_exitlimit.core import Limiter, Limits, Tuning, make_exit
from scrapy_exitlimit.core.warm import recall
from scrapy_exitlimit.state_file import StateFile, dump, lock_path, locked, read

fcntl = pytest.importorskip("fcntl")

DAY = 86400.0
WORKERS = 4
SAVES = 20


def crawled(origin: str, wall: float) -> Limiter:
    """A limiter that crawled ``origin`` in this run, at a known rate: what it saves."""
    lim = Limiter([make_exit("http://127.0.0.10:3128")], Limits(concurrency=4),
                  clock=time.monotonic, tuning=Tuning(margin=0.005), rng=random.Random(7))
    pool = {"clean": 4.9, "ceiling": 5.1, "seen": 5.1, "settled": True, "drift": None}
    recall(lim, {origin: {"at": wall, "pool": pool, "site": None, "pairs": {}}},
           wall_now=wall, max_age=DAY)
    assert not isinstance(lim.try_admit(origin), float)
    return lim


def origin_of(worker: int, save: int) -> str:
    return f"http://w{worker}-s{save}.test"


def save_one_origin_each_time(path: str, worker: int, start) -> None:
    """Each save adds one new origin: a save lost to another process's is a missing one.
    A long lock timeout: this is about lost entries, not about waiting."""
    sf = StateFile(path, save_interval=300, max_age=DAY, lock_timeout=60.0)
    start.wait()  # every process at once, so their saves overlap
    for save in range(SAVES):
        if not sf.save(crawled(origin_of(worker, save), time.time())):
            raise SystemExit(f"worker {worker}: save {save} not written")


def test_processes_saving_one_file_at_once_keep_every_origin(tmp_path):
    path = tmp_path / "state.json"
    # fork: the workers start at once (spawn imports Scrapy again in each, over a second)
    ctx = multiprocessing.get_context("fork")
    start = ctx.Barrier(WORKERS)
    workers = [ctx.Process(target=save_one_origin_each_time, args=(str(path), w, start))
               for w in range(WORKERS)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert [worker.exitcode for worker in workers] == [0] * WORKERS
    expected = {origin_of(w, s) for w in range(WORKERS) for s in range(SAVES)}
    missing = expected - set(read(path))
    assert not missing, f"{len(missing)} of {len(expected)} origins lost: {sorted(missing)}"
    # the lock file stays (deleting it would race); no temporary file is left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json", "state.json.lock"]


def test_a_save_gives_up_on_a_held_lock_with_a_warning_and_leaves_the_file(tmp_path, caplog):
    path = tmp_path / "state.json"
    before = dump({}, 100.0)
    path.write_text(before)
    sf = StateFile(path, save_interval=300, max_age=DAY, lock_timeout=0.2)
    lim = crawled("http://site.test", time.time())
    # another open file description: flock excludes it as it would another process
    with locked(lock_path(path), 0.0) as held, caplog.at_level(logging.WARNING):
        assert held
        began = time.monotonic()
        assert not sf.save(lim)
        waited = time.monotonic() - began
    assert 0.2 <= waited < 1.5
    assert path.read_text() == before
    assert "EXITLIMIT_STATE_FILE" in caplog.text and str(path) in caplog.text
    assert "another process" in caplog.text and "skipped" in caplog.text
    assert sf.save(lim)  # the lock released: the next save writes
    assert "http://site.test" in read(path)


def test_a_save_waits_for_a_lock_released_within_the_timeout(tmp_path):
    path = tmp_path / "state.json"
    sf = StateFile(path, save_interval=300, max_age=DAY, lock_timeout=5.0)
    other = os.open(lock_path(path), os.O_RDWR | os.O_CREAT)
    fcntl.flock(other, fcntl.LOCK_EX)
    release = threading.Timer(0.2, os.close, args=(other,))  # closing it releases the lock
    release.start()
    began = time.monotonic()
    assert sf.save(crawled("http://site.test", time.time()))
    release.join()
    assert 0.15 <= time.monotonic() - began < 4.0
    assert "http://site.test" in read(path)


def test_nothing_learned_and_no_file_makes_no_lock_file(tmp_path):
    sf = StateFile(tmp_path / "state.json", save_interval=300, max_age=DAY)
    lim = Limiter([make_exit("http://127.0.0.10:3128")], Limits(concurrency=4),
                  clock=time.monotonic)
    assert not sf.save(lim)
    assert list(tmp_path.iterdir()) == []


def test_without_fcntl_saves_are_not_locked(tmp_path, monkeypatch):
    monkeypatch.setattr(state_file, "fcntl", None)
    path = tmp_path / "state.json"
    sf = StateFile(path, save_interval=300, max_age=DAY)
    assert sf.save(crawled("http://site.test", time.time()))
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_a_directory_without_write_permission_is_a_warning_naming_the_setting(
        tmp_path, caplog):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        try:
            (folder / "probe").touch()
        except PermissionError:
            pass
        else:
            pytest.skip("this user writes into a read-only directory (root)")
        sf = StateFile(folder / "state.json", save_interval=300, max_age=DAY)
        with caplog.at_level(logging.WARNING):
            assert not sf.save(crawled("http://site.test", time.time()))
    finally:
        folder.chmod(0o700)
    assert "EXITLIMIT_STATE_FILE" in caplog.text and "cannot be written" in caplog.text
    assert list(folder.iterdir()) == []
