"""Every benchmark runs for about a second (bench/smoke.py), so none of them rots."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.timeout(300)
def test_every_benchmark_runs_for_a_second() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.smoke"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
