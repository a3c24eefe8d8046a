"""Skill tools: load_skill shows a skill's SKILL.md; run_skill_script runs one of its scripts in a
sandboxed subprocess and returns the JSON it prints.

The sandbox: `python -I` (no user site, no PYTHON* variables) with a minimal environment, the
session's own working folder (`files/` in the run's workspace, or a folder per session under
`workspace_root`), JSON arguments on stdin, a wall-clock timeout that kills the whole
process group, an address-space cap, a cap on what it prints, and, unless the skill declares
`network: true`, no network: a bootstrap replaces the socket entry points before the script runs,
and where the system allows it the process also gets an empty network namespace (`unshare`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from core.agent.tools import ToolContext
from core.errors import ToolError
from core.skills import Skill, session_workdir

__all__ = ["LoadSkill", "LoadSkillArgs", "RunSkillArgs", "RunSkillScript"]

log = logging.getLogger(__name__)

MAX_ARGS_BYTES = 64 * 1024
STDERR_KEEP = 4096  # the tail of stderr kept for error details
UNSHARE_PATHS = ("/usr/bin/unshare", "/bin/unshare")  # fixed paths: never whatever PATH says
UNSHARE_FLAGS = (("--net",), ("--map-root-user", "--net"))  # as root; else in a user namespace

# Runs before the script: caps memory, closes the network unless allowed, then runs the script as
# __main__ with its folder importable. argv: memory bytes, "1" if network is allowed, script path.
BOOTSTRAP = """\
import resource, runpy, socket, sys
cap, net, script = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3]
hard = resource.getrlimit(resource.RLIMIT_AS)[1]
if hard != resource.RLIM_INFINITY:
    cap = min(cap, hard)
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
if not net:
    def refuse(*args, **kwargs):
        raise PermissionError("network access is not allowed for this skill")
    for name in ("connect", "connect_ex", "sendto", "sendmsg"):
        setattr(socket.socket, name, refuse)
    for name in ("create_connection", "getaddrinfo", "gethostbyname", "gethostbyname_ex"):
        setattr(socket, name, refuse)
sys.argv = [script]
sys.path.insert(0, script.rsplit("/", 1)[0])
runpy.run_path(script, run_name="__main__")
"""


class LoadSkillArgs(BaseModel):
    name: str = Field(min_length=1, max_length=64, description="The skill's name.")


class LoadSkill:
    """load_skill: the full SKILL.md of a skill, and the scripts it ships."""

    name: ClassVar[str] = "load_skill"
    description: ClassVar[str] = (
        "Read a skill's full instructions (what it does, when to use it, how to call its "
        "scripts) before using it. Skills are listed by name in your instructions."
    )
    args_model: ClassVar[type[BaseModel]] = LoadSkillArgs
    read_only: ClassVar[bool] = True
    timeout_s: ClassVar[float] = 5.0

    def __init__(self, skills: Sequence[Skill]) -> None:
        self._skills = {s.name: s for s in skills}

    async def __call__(self, args: LoadSkillArgs, ctx: ToolContext) -> dict[str, Any]:
        skill = _find(self._skills, args.name)
        return {"name": skill.name, "skill_md": skill.instructions, "scripts": skill.scripts()}


class RunSkillArgs(BaseModel):
    skill: str = Field(min_length=1, max_length=64, description="The skill's name.")
    script: str = Field(
        min_length=1, max_length=200, description="A script of that skill, e.g. 'quote.py'."
    )
    args: dict[str, Any] = Field(
        default_factory=dict, description="The JSON object the script reads on stdin."
    )


class RunSkillScript:
    """run_skill_script: run a skill's script in the sandbox and return its JSON output."""

    name: ClassVar[str] = "run_skill_script"
    description: ClassVar[str] = (
        "Run a Python script of a skill with a JSON object of arguments, as its SKILL.md says "
        "(load the skill first). Returns the JSON the script prints."
    )
    args_model: ClassVar[type[BaseModel]] = RunSkillArgs
    read_only: ClassVar[bool] = False  # a script may write files in the session's folder
    timeout_s: ClassVar[float] = 120.0  # a backstop: each run has its own, shorter, timeout

    def __init__(
        self,
        skills: Sequence[Skill],
        workspace_root: str | Path | None = None,
        *,
        timeout_s: float = 20.0,
        memory_mb: int = 256,
        max_output_bytes: int = 64 * 1024,
        python: str = sys.executable,
    ) -> None:
        if not 0 < timeout_s < self.timeout_s - 5:
            raise ValueError(f"timeout_s must be between 0 and {self.timeout_s - 5:g}")
        self._skills = {s.name: s for s in skills}
        self._root = None if workspace_root is None else Path(workspace_root)
        self._run_timeout = timeout_s
        self._memory = memory_mb * 1024 * 1024
        self._max_output = max_output_bytes
        self._python = python
        self._unshare = next((p for p in UNSHARE_PATHS if Path(p).is_file()), None)
        self._sandbox: tuple[str, ...] | None = None  # the unshare prefix, once detected
        self._detect = asyncio.Lock()

    async def isolation(self) -> str:
        """'netns' when scripts without network also get an empty network namespace, else
        'bootstrap' (the socket replacements alone)."""
        return "netns" if await self._net_sandbox() else "bootstrap"

    async def __call__(self, args: RunSkillArgs, ctx: ToolContext) -> Any:
        skill = _find(self._skills, args.skill)
        script = _resolve_script(skill, args.script)
        payload = json.dumps(args.args, ensure_ascii=False).encode()
        if len(payload) > MAX_ARGS_BYTES:
            raise ToolError(f"args are too large ({len(payload)} bytes; at most {MAX_ARGS_BYTES}).")
        workdir = self._workdir(ctx)
        prefix = () if skill.network else await self._net_sandbox()
        ref = f"{skill.name}/{args.script}"
        proc = await asyncio.create_subprocess_exec(
            *prefix,
            self._python,
            *("-I", "-B", "-X", "utf8", "-c", BOOTSTRAP),
            *(str(self._memory), "1" if skill.network else "0", str(script)),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=workdir,
            env=_environment(workdir, skill),
            start_new_session=True,  # its own process group, killed whole on timeout
        )
        try:
            async with asyncio.timeout(self._run_timeout):
                out, err, too_big = await self._communicate(proc, payload)
        except TimeoutError:
            raise ToolError(
                f"{ref} took longer than {self._run_timeout:g} s and was stopped."
            ) from None
        finally:
            if proc.returncode is None:  # timed out or cancelled: never leave it running
                _kill(proc)
                await proc.wait()
            await _drain(proc)
        if too_big:
            raise ToolError(f"{ref} printed more than {self._max_output} bytes and was stopped.")
        detail = _tail(err)
        if proc.returncode:
            how = f"was killed (signal {-proc.returncode})" if proc.returncode < 0 else "failed"
            raise ToolError(f"{ref} {how} (exit {proc.returncode}): {detail or 'no error output'}")
        try:
            return json.loads(out)
        except ValueError:
            shown = detail or (out.decode(errors="replace").strip()[:120] or "nothing")
            raise ToolError(f"{ref} did not print JSON. It printed: {shown}") from None

    def _workdir(self, ctx: ToolContext) -> Path:
        """The session's folder from the run (its `files/`), else one under workspace_root."""
        if ctx.workspace is not None:
            folder = ctx.workspace.resolve() / "files"  # apart from the kept tool results
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            return folder
        if self._root is None:
            raise ToolError("Skill scripts need a working folder, and this session has none.")
        return session_workdir(self._root, ctx.session)

    async def _communicate(
        self, proc: asyncio.subprocess.Process, payload: bytes
    ) -> tuple[bytes, bytes, bool]:
        """Feed stdin and read both outputs at once; stop the script if it prints too much."""
        assert proc.stdin is not None
        assert proc.stdout is not None
        assert proc.stderr is not None

        async def feed(stdin: asyncio.StreamWriter) -> None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                stdin.write(payload)
                await stdin.drain()
            stdin.close()

        async def read_out(stream: asyncio.StreamReader) -> tuple[bytes, bool]:
            buf = bytearray()
            while chunk := await stream.read(65536):
                buf += chunk
                if len(buf) > self._max_output:
                    _kill(proc)
                    return bytes(buf[: self._max_output]), True
            return bytes(buf), False

        async def read_err(stream: asyncio.StreamReader) -> bytes:
            buf = bytearray()
            while chunk := await stream.read(65536):
                buf = (buf + chunk)[-STDERR_KEEP:]
            return bytes(buf)

        _, (out, too_big), err = await asyncio.gather(
            feed(proc.stdin), read_out(proc.stdout), read_err(proc.stderr)
        )
        await proc.wait()
        return out, err, too_big

    async def _net_sandbox(self) -> tuple[str, ...]:
        """The unshare prefix that works here (tried once), or () where none does."""
        async with self._detect:
            if self._sandbox is None:
                self._sandbox = await _probe_unshare(self._unshare, self._python)
                log.info(
                    "skill scripts without network: %s", " ".join(self._sandbox) or "bootstrap"
                )
            return self._sandbox


async def _drain(proc: asyncio.subprocess.Process) -> None:
    """Read what a finished script left in its pipes (a script stopped for printing too much
    left its output unread): a pipe is closed once read to the end, not when collected."""
    with contextlib.suppress(TimeoutError, OSError):
        async with asyncio.timeout(1.0):  # a grandchild that left the group may hold a pipe
            for stream in (proc.stdout, proc.stderr):
                while stream is not None and await stream.read(65536):
                    pass


async def _probe_unshare(unshare: str | None, python: str) -> tuple[str, ...]:
    """The first unshare invocation that can start Python here (root, or a user namespace)."""
    if unshare is None:
        return ()
    for flags in UNSHARE_FLAGS:
        cmd = (unshare, *flags, "--")
        proc = await asyncio.create_subprocess_exec(
            *cmd,
            python,
            *("-I", "-c", ""),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        if await proc.wait() == 0:
            return cmd
    return ()


def _find(skills: dict[str, Skill], name: str) -> Skill:
    skill = skills.get(name)
    if skill is None:
        known = ", ".join(skills) or "none"
        raise ToolError(f"There is no skill named {name!r}. Skills: {known}.")
    return skill


def _resolve_script(skill: Skill, script: str) -> Path:
    """The script's real path, only if it is a .py file inside the skill's folder."""
    path = (skill.path / script).resolve()
    if path.suffix != ".py" or not path.is_relative_to(skill.path) or not path.is_file():
        scripts = ", ".join(skill.scripts()) or "none"
        raise ToolError(f"{skill.name} has no script {script!r}. Scripts: {scripts}.")
    return path


def _environment(workdir: Path, skill: Skill) -> dict[str, str]:
    """Built from nothing: no variable of the gateway (keys, tokens) reaches a script."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": str(workdir),
        "TMPDIR": str(workdir),
        "SKILL_DIR": str(skill.path),
    }


def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _tail(err: bytes, lines: int = 3) -> str:
    """The last lines of stderr: for a traceback, where the error is named."""
    text = err.decode(errors="replace").strip().splitlines()
    return " | ".join(line.strip() for line in text[-lines:] if line.strip())
