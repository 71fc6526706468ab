"""The lab in a process of its own, for benchmarks, the demo and tests that crawl from
other processes: ``python -m scrapy_exitlimit.lab ARGS``, once it serves."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def start_lab_process(*args: str, stderr: Any = subprocess.DEVNULL,
                      cwd: str | Path | None = None
                      ) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """Start the lab CLI with ``args`` and wait for the line it prints once serving: its
    origin URL(s), exit URLs and the IP each exit leaves from, parsed. Raises SystemExit if it
    ends first. The caller stops it (``terminate()``)."""
    proc = subprocess.Popen([sys.executable, "-m", "scrapy_exitlimit.lab", *args],
                            stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=cwd)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise SystemExit(f"the lab did not start (python -m scrapy_exitlimit.lab "
                         f"{' '.join(args)}: exit code {proc.returncode})")
    return proc, json.loads(line)
