"""What setup.cfg promises is what CI tests: its floors are the versions .ci/run installs
into its lowest-versions venv."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

from packaging.version import Version

ROOT = Path(__file__).parent.parent


def test_the_declared_floors_are_the_versions_ci_tests_at_the_bottom():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    floors = dict(re.findall(r"^(\w+)>=([\d.]+)", cfg["options"]["install_requires"], re.M))
    pins = dict(re.findall(r"^(\w+)==([\d.]+)", (ROOT / ".ci/lowest.txt").read_text(), re.M))
    assert {k.lower(): Version(v) for k, v in floors.items()} == {
        k: Version(v) for k, v in pins.items()}
    assert ".ci/lowest.txt" in (ROOT / ".ci/run").read_text()
