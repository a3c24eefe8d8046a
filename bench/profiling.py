"""py-spy, attached to the gateway while a benchmark measures it, and a function-level summary
of what it saw (share of samples where a function is running itself, and where it is anywhere
on the stack). py-spy comes with the `bench` extra; without it profiling is skipped."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

from bench.common import LOAD_CORE, pin

__all__ = ["PySpy", "summarize"]

_FRAME = re.compile(r"^(?P<func>.+?) \((?P<file>[^:()]+)(?::\d+)?\)$")


class PySpy:
    """`py-spy record` on a pid for `duration_s`, in raw (collapsed stack) format. Only
    samples that hold the GIL count (`--gil`): on the pinned core the store's threads take
    turns with the event loop, and a thread waiting for the GIL (or the core) would otherwise
    be charged to whatever call it was about to return from."""

    def __init__(self, pid: int, duration_s: float, out: Path, rate: int = 250) -> None:
        self.out = out
        self.proc: subprocess.Popen[bytes] | None = None
        out.parent.mkdir(parents=True, exist_ok=True)
        out.unlink(missing_ok=True)
        beside = Path(sys.executable).parent / "py-spy"  # the venv's, when not on PATH
        exe = str(beside) if beside.exists() else shutil.which("py-spy")
        if exe is None:
            return
        argv = [
            *pin(LOAD_CORE),
            exe,
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(max(1, round(duration_s))),
            "--rate",
            str(rate),
            "--format",
            "raw",
            "--threads",
            "--gil",
            "--output",
            str(out),
        ]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def wait(self, timeout: float = 60.0) -> str:
        """The summary, or why there is none."""
        if self.proc is None:
            return "py-spy is not installed (pip install '.[bench]')"
        try:
            _, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return "py-spy did not finish"
        if not self.out.exists():
            return f"py-spy failed: {err.decode(errors='replace')[-500:]}"
        return summarize(self.out)


_IDLE = "EpollSelector.select"
_BOILERPLATE = (
    "<module>",
    "runpy>",
    "run_forever",
    "_run_once",
    "run_until_complete",
    "Handle._run",
    "main (gateway/cli.py)",
    "_run (gateway/cli.py)",
    "run_app",
)


def _name(frame: str) -> str:
    m = _FRAME.match(frame.strip())
    if m is None:
        return frame.strip()
    file = m.group("file")
    for root in ("site-packages/", "/work/main/", "lib/python3"):
        if root in file:
            file = file.split(root, 1)[1]
            break
    return f"{m.group('func')} ({file})"


def summarize(raw: Path, top: int = 22) -> str:
    """Top functions by self and by inclusive share of the samples of the main thread."""
    self_c: Counter[str] = Counter()
    incl_c: Counter[str] = Counter()
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [f for f in stack.split(";") if f]
        if frames and frames[0].startswith("thread ("):
            if "MainThread" not in frames[0] and not frames[0].startswith("thread (0x"):
                continue
            frames = frames[1:]
        if frames and frames[0].startswith("process "):
            frames = frames[1:]
        if not frames:
            continue
        n = int(count)
        total += n
        names = [_name(f) for f in frames]
        self_c[names[-1]] += n
        for name in set(names):
            incl_c[name] += n
    if not total:
        return "no samples"
    idle = sum(c for n, c in self_c.items() if n.startswith(_IDLE))
    busy = total - idle
    out = [
        f"{total} samples of the gateway's main thread holding the GIL (py-spy, 250 Hz); "
        f"{busy} busy, {idle} in epoll.",
        "Shares below are of the busy samples.",
        "",
        "self %  function",
    ]
    top_self = [(n, c) for n, c in self_c.most_common(top + 1) if not n.startswith(_IDLE)]
    out += [f"{100 * c / busy:5.1f}  {name}" for name, c in top_self[:top]]
    out += ["", "total %  function (anywhere on the stack)"]
    incl = [
        (n, c)
        for n, c in incl_c.most_common(top * 4)
        if not any(k in n for k in _BOILERPLATE) and not n.startswith(_IDLE)
    ]
    out += [f"{100 * c / busy:5.1f}  {name}" for name, c in incl[:top]]
    return "\n".join(out)
