"""The layers keep to their boundaries (DESIGN.md: the core decides, the backend stores,
the middleware waits)."""

import ast
from pathlib import Path

import scrapy_exitlimit

PACKAGE = Path(scrapy_exitlimit.__file__).parent
#: the backends own a Limiter; the simulator and the lab drive the core directly
OWNERS = ("core", "backends", "sim", "lab")


def _glue_modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] not in OWNERS:
            yield path


def test_the_glue_asks_the_backend_and_never_reaches_its_limiter():
    reached = [f"{path.relative_to(PACKAGE)}:{node.lineno}"
               for path in _glue_modules()
               for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.Attribute) and node.attr == "limiter"]
    assert reached == []


def test_the_core_imports_no_scrapy_twisted_or_redis():
    imported = set()
    for path in (PACKAGE / "core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    assert not imported & {"scrapy", "twisted", "redis"}
