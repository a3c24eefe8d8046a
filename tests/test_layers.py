"""Dependencies point one way (gateway → channels, providers → core): core/ imports neither the
outer packages, nor aiohttp, nor a platform SDK, nor reads the environment."""

from __future__ import annotations

import ast
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
