"""CI's short run of scripts/crash_test.py (SIGKILL under load, restart, verify from the store),
on both stores, and a check that its verifier really catches each kind of violation."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import PG_BASE, ROOT

SCRIPT = ROOT / "scripts" / "crash_test.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("crash_test", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["crash_test"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(60)
@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_two_rounds_of_sigkill_under_load_lose_and_repeat_nothing(store: str) -> None:
    args = ["--rounds", "2", "--messages", "40", "--sessions", "8", "--seed", "11"]
    args += ["--store", store, "--pg-url", PG_BASE, "--round-timeout", "40"]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=55,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr[-3000:]
    rounds = re.findall(r"^round \d/2 .*$", out, re.MULTILINE)
    assert len(rounds) == 2, out
    for line in rounds:
        assert "killed at" in line
        assert "no kill" not in line, line  # the kill landed while the load was running
        assert "sent 40, accepted 40" in line, line
        assert "answered 40, duplicates 0, missing 0, order violations 0" in line, line
    assert "80 answered exactly once in order: OK" in out


def _rows(
    sessions: list[Any], replies: list[tuple[str, str, str]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Store rows as the script reads them: the accepted messages, and these replies."""
    inbox = [
        {"id": i, "session": s.ident, "payload": json.dumps({"text": t}), "status": "done"}
        for i, (s, t) in enumerate((s, t) for s in sessions for t in s.accepted)
    ]
    outbox = [
        {"id": i, "session": ident, "reply": json.dumps({"text": text}), "status": status}
        for i, (ident, text, status) in enumerate(replies)
    ]
    return inbox, outbox


def test_the_verifier_passes_a_clean_run_and_catches_each_violation() -> None:
    m = _script()
    a = m.Session("web", "A", ["a0", "a1", "a2"], accepted=["a0", "a1", "a2"])
    b = m.Session("whatsapp", "B", ["b0", "b1"], accepted=["b0", "b1"])
    clean = [("A", "echo: a0", "sent"), ("B", "echo: b0", "sent"), ("A", "echo: a1", "sent")]
    clean += [("B", "echo: b1", "sent"), ("A", "echo: a2", "sent")]
    f = m.verify([a, b], *_rows([a, b], clean))
    assert (f.answered, f.violations, f.details) == (5, 0, [])

    swapped = [clean[0], clean[4], clean[2], clean[1], clean[3]]  # a2 before a1
    assert m.verify([a, b], *_rows([a, b], swapped)).order_violations == 1
    doubled = [*clean, ("B", "echo: b0", "sent")]
    assert m.verify([a, b], *_rows([a, b], doubled)).duplicates == 1
    lost = clean[:-1]
    assert m.verify([a, b], *_rows([a, b], lost)).missing == 1
    stuck = [*clean[:-1], ("A", "echo: a2", "pending")]
    assert m.verify([a, b], *_rows([a, b], stuck)).undelivered == 1
    stray = [*clean, ("A", "echo: never sent", "sent")]
    assert m.verify([a, b], *_rows([a, b], stray)).unexpected == 1
    inbox, outbox = _rows([a, b], clean)
    inbox.append({**inbox[0], "id": 99})
    assert m.verify([a, b], inbox, outbox).stored_twice == 1
    late = m.Session("web", "C", ["c0", "c1"], accepted=["c0"])
    f = m.verify([late], *_rows([late], [("C", "echo: c0", "sent")]))
    assert f.violations == 1  # c1 was never accepted in time
    assert any("never accepted" in d for d in f.details)


def test_the_script_refuses_replicas_on_sqlite() -> None:
    m = _script()
    with pytest.raises(SystemExit):
        m.parse_args(["--store", "sqlite", "--replicas", "2"])
    assert m.parse_args(["--store", "postgres", "--replicas", "2"]).replicas == 2
