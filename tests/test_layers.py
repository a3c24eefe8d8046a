"""Dependencies point one way (gateway → channels, providers → core): core/ imports neither the
outer packages, nor aiohttp, nor a platform SDK, nor reads the environment. And the modules few
gateways need are imported where first used, so an idle gateway's memory does not hold them."""

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


# megabytes of memory each, for what only some gateways ever do: grapheme-cluster cuts inside a
# long word (regex), HTTP tools' JSON Schemas (jsonschema); the idle-RSS benchmark's margin
IMPORTED_WHEN_USED = ("regex", "jsonschema")


def imported_at_load(path: Path) -> set[str]:
    """What a module imports when it is loaded: its imports outside functions and outside
    `if TYPE_CHECKING:` blocks."""
    names: set[str] = set()
    todo: list[ast.AST] = [ast.parse(path.read_text(), str(path))]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            todo.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        todo.extend(ast.iter_child_nodes(node))
    return names


CORE = sorted((ROOT / "core").rglob("*.py"))
GATEWAY = sorted(p for d in ("core", "channels", "gateway") for p in (ROOT / d).rglob("*.py"))


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


@pytest.mark.parametrize("path", GATEWAY, ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_few_gateways_need_are_imported_where_used(path: Path) -> None:
    loaded = imported_at_load(path)
    assert sorted(n for n in loaded if n.split(".")[0] in IMPORTED_WHEN_USED) == []


def test_the_check_tells_an_import_at_load_from_one_where_used(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\nimport regex\nif TYPE_CHECKING:\n    import a\n"
        "else:\n    import b\nclass C:\n    import c\n"
        "def f():\n    import jsonschema\nasync def g():\n    import d\n"
    )
    assert imported_at_load(module) == {"typing", "regex", "b", "c"}
