"""Dependencies point one way (gateway → channels, providers → core): core/ imports neither the
outer packages, nor aiohttp, nor a platform SDK, nor reads the environment. And the modules few
gateways need are imported where first used, so an idle gateway's memory does not hold them."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN_IN_CORE = (
    "gateway",
    "channels",
    "providers",
    "aiohttp",
    "telegram",
    "slack_bolt",
    "slack_sdk",
    "yarl",
)


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def environment_reads(path: Path) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
            and node.attr in ("environ", "getenv", "environb")
        ):
            lines.append(node.lineno)
    return lines


# megabytes of memory each, for what only some gateways ever do: grapheme-cluster cuts inside a
# long word (regex), HTTP tools' JSON Schemas (jsonschema); the idle-RSS benchmark's margin
IMPORTED_WHEN_USED = ("regex", "jsonschema")
# every module of the gateway, loaded in a fresh interpreter: then which of those it holds
_LOAD_ALL = """
import importlib, pkgutil, sys
for pkg in ("core", "channels", "gateway", "providers"):
    for m in pkgutil.walk_packages(importlib.import_module(pkg).__path__, pkg + "."):
        if not m.name.endswith("__main__"):
            importlib.import_module(m.name)
print(" ".join(sorted(set(sys.argv[1:]) & set(sys.modules))))
"""


def loaded_by_the_gateway(names: Sequence[str]) -> list[str]:
    """Which of `names` loading every module of the gateway loads (directly or through a
    library), in a fresh interpreter."""
    run = subprocess.run(
        [sys.executable, "-c", _LOAD_ALL, *names],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return run.stdout.split()


CORE = sorted((ROOT / "core").rglob("*.py"))


@pytest.mark.parametrize("path", CORE, ids=lambda p: str(p.relative_to(ROOT)))
def test_core_depends_on_nothing_outside_it(path: Path) -> None:
    bad = sorted(name for name in imported(path) if name.split(".")[0] in FORBIDDEN_IN_CORE)
    assert bad == []
    assert environment_reads(path) == []


def test_the_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import os\nfrom aiohttp import web\nimport channels.base\nx = os.environ\n")
    assert {"aiohttp", "channels.base"} <= imported(module)
    assert environment_reads(module) == [4]


def test_modules_few_gateways_need_are_imported_where_used() -> None:
    # markdown_it, which every reply needs, shows the check sees what is loaded
    assert loaded_by_the_gateway([*IMPORTED_WHEN_USED, "markdown_it"]) == ["markdown_it"]
