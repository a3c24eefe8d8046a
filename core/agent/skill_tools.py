"""Skill tools: load_skill shows a skill's SKILL.md; run_skill_script runs one of its scripts in a
sandboxed subprocess and returns the JSON it prints.

The sandbox: `python -I` (no user site, no PYTHON* variables) with a minimal environment, the
session's own working folder (`files/` in the run's workspace, or a folder per session under
`workspace_root`), JSON arguments on stdin, a wall-clock timeout, its whole process group killed
when the call ends (a child it left running too), an address-space cap, a cap on what it prints,
and, unless the skill declares `network: true`, no network: a bootstrap replaces the socket entry
points before the script runs, and where the system allows it the process also gets an empty
network namespace (`unshare`). Where the kernel takes one (x86_64, aarch64; containers too), a
seccomp filter (core.agent.seccomp), inherited by everything the script starts, refuses sockets
other than AF_UNIX to scripts without network, and to every script leaving its session and
reaching into another process (the gateway's open connections).
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

from core.agent import seccomp
from core.agent.tools import ToolContext
from core.errors import ToolError
from core.skills import Skill, session_workdir

__all__ = ["LoadSkill", "LoadSkillArgs", "RunSkillArgs", "RunSkillScript"]

log = logging.getLogger(__name__)

MAX_ARGS_BYTES = 64 * 1024
STDERR_KEEP = 4096  # the tail of stderr kept for error details
EXIT_POLL_S = 0.05  # how often a script's exit is looked at while a child holds its pipes
PIPE_GRACE_S = 0.25  # once the script has exited, to read what it printed before
REAP_S = 1.0  # at the end, to read the pipes to their end and collect the script
UNSHARE_PATHS = ("/usr/bin/unshare", "/bin/unshare")  # fixed paths: never whatever PATH says
UNSHARE_FLAGS = (("--net",), ("--map-root-user", "--net"))  # as root; else in a user namespace

# Installs a seccomp filter given as hex (argv[1], "" for none); exits 3 if the kernel refuses it.
SECCOMP = """\
import sys
if sys.argv[1]:
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    code = ctypes.create_string_buffer(bytes.fromhex(sys.argv[1]))
    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    program = Program(len(sys.argv[1]) // 16, ctypes.addressof(code))
    zero = ctypes.c_ulong(0)
    if libc.prctl(38, ctypes.c_ulong(1), zero, zero, zero) or libc.prctl(
        22, ctypes.c_ulong(2), ctypes.byref(program), zero, zero
    ):
        print("seccomp refused: errno", ctypes.get_errno(), file=sys.stderr)
        sys.exit(3)
"""

# Runs before the script: the seccomp filter, caps memory, closes the network unless allowed,
# then runs the script as __main__ with its folder importable. argv: the filter (hex, or ""),
# memory bytes, "1" if network is allowed, script path.
BOOTSTRAP = (
    SECCOMP
    + """\
import resource, runpy, socket
cap, net, script = int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
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
)


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
        self._seccomp: bool | None = None  # whether the kernel takes the filter, once tried
        self._detect = asyncio.Lock()

    async def isolation(self) -> set[str]:
        """The layers keeping scripts without network off it: 'bootstrap' (the socket
        replacements) always, 'seccomp' where the kernel takes the filter, 'netns' where an
        empty network namespace can be made."""
        layers = {"bootstrap"}
        if await self._filter(network=False):
            layers.add("seccomp")
        if await self._net_sandbox():
            layers.add("netns")
        return layers

    async def __call__(self, args: RunSkillArgs, ctx: ToolContext) -> Any:
        skill = _find(self._skills, args.skill)
        script = _resolve_script(skill, args.script)
        payload = _encode_args(args.args)
        workdir = self._workdir(ctx)
        prefix = () if skill.network else await self._net_sandbox()
        seccomp = await self._filter(network=skill.network)
        ref = f"{skill.name}/{args.script}"
        proc = await asyncio.create_subprocess_exec(
            *prefix,
            self._python,
            *("-I", "-B", "-X", "utf8", "-c", BOOTSTRAP),
            *(seccomp, str(self._memory), "1" if skill.network else "0", str(script)),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=workdir,
            env=_environment(workdir, skill),
            start_new_session=True,  # its own process group, killed whole at the end
        )
        try:
            async with asyncio.timeout(self._run_timeout):
                out, err, too_big = await self._communicate(proc, payload)
        except TimeoutError:
            raise ToolError(
                f"{ref} took longer than {self._run_timeout:g} s and was stopped."
            ) from None
        finally:
            await _reap(proc)  # succeeded, failed, timed out or cancelled: nothing stays running
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
        """Feed stdin and read both outputs until the script exits; stop it if it prints too much.

        The script's exit ends the reading, not the end of its pipes: a child it left running may
        hold them open, and what the script printed is complete once it has exited."""
        assert proc.stdin is not None
        assert proc.stdout is not None
        assert proc.stderr is not None
        out, err = bytearray(), bytearray()

        async def feed(stdin: asyncio.StreamWriter) -> None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                stdin.write(payload)
                await stdin.drain()
            stdin.close()

        async def read_out(stream: asyncio.StreamReader) -> None:
            while chunk := await stream.read(65536):
                if len(out) <= self._max_output:
                    out.extend(chunk)
                    if len(out) > self._max_output:
                        _kill(proc)  # and read on to the end, so the pipe closes

        async def read_err(stream: asyncio.StreamReader) -> None:
            while chunk := await stream.read(65536):
                err.extend(chunk)
                del err[:-STDERR_KEEP]

        async with asyncio.TaskGroup() as group:
            io = [
                group.create_task(feed(proc.stdin)),
                group.create_task(read_out(proc.stdout)),
                group.create_task(read_err(proc.stderr)),
            ]
            await _exited(proc, io)
            await asyncio.wait(io, timeout=PIPE_GRACE_S)  # what is still on its way in
            for task in io:
                task.cancel()  # a no-op unless a child holds a pipe
        return bytes(out[: self._max_output]), bytes(err), len(out) > self._max_output

    async def _net_sandbox(self) -> tuple[str, ...]:
        """The unshare prefix that works here (tried once), or () where none does."""
        async with self._detect:
            if self._sandbox is None:
                self._sandbox = await _probe_unshare(self._unshare, self._python)
                log.info(
                    "skill scripts without network: %s", " ".join(self._sandbox) or "bootstrap"
                )
            return self._sandbox

    async def _filter(self, *, network: bool) -> str:
        """The seccomp filter for a script, as hex, or "" where the kernel refuses it (tried
        once; the scripts then run without it, and the log says so)."""
        code = seccomp.program(network=network)
        async with self._detect:
            if self._seccomp is None:
                self._seccomp = code is not None and await _takes_filter(self._python, code)
                if not self._seccomp:
                    log.warning(
                        "seccomp is not available here: a skill script's child that leaves its"
                        " process group can outlive the call, and scripts without network are"
                        " kept off it by a network namespace (where one can be made) and"
                        " Python's socket replacements only"
                    )
        return code.hex() if self._seccomp and code is not None else ""


async def _exited(proc: asyncio.subprocess.Process, io: list[asyncio.Task[None]]) -> None:
    """Return once the script itself has exited. `proc.wait()` also waits for the pipes to
    close, which a child the script left running may never do, so while they are open the exit
    status is looked at every EXIT_POLL_S instead."""
    while proc.returncode is None:
        if all(task.done() for task in io):
            await proc.wait()  # its pipes are closed: wait() sees the exit itself
            return
        await asyncio.wait(io, timeout=EXIT_POLL_S)


async def _reap(proc: asyncio.subprocess.Process) -> None:
    """Kill the script's whole process group, then read its pipes to the end and collect it: a
    pipe closes once read to the end, not when collected, and a transport left open is only
    closed (with a warning) by the garbage collector. Bounded: a process that left the group
    (setsid) may still hold a pipe."""
    _kill(proc)
    with contextlib.suppress(TimeoutError, OSError):
        async with asyncio.timeout(REAP_S):
            for stream in (proc.stdout, proc.stderr):
                while stream is not None and await stream.read(65536):
                    pass
            await proc.wait()


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


async def _takes_filter(python: str, code: bytes) -> bool:
    """Whether a Python started like a script takes the seccomp filter."""
    proc = await asyncio.create_subprocess_exec(
        python,
        *("-I", "-c", SECCOMP, code.hex()),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    return await proc.wait() == 0


def _find(skills: dict[str, Skill], name: str) -> Skill:
    skill = skills.get(name)
    if skill is None:
        known = ", ".join(skills) or "none"
        raise ToolError(f"There is no skill named {name!r}. Skills: {known}.")
    return skill


def _resolve_script(skill: Skill, script: str) -> Path:
    """The script's real path, only if it is a .py file inside the skill's folder."""
    try:
        path = (skill.path / script).resolve()
        found = path.suffix == ".py" and path.is_relative_to(skill.path) and path.is_file()
    except (OSError, ValueError, RuntimeError):  # a NUL byte in the name; a symlink loop
        found = False
    if not found:
        scripts = ", ".join(skill.scripts()) or "none"
        raise ToolError(f"{skill.name} has no script {script!r}. Scripts: {scripts}.")
    return path


def _encode_args(args: dict[str, Any]) -> bytes:
    """The JSON the script reads on stdin. A lone surrogate is valid JSON but no UTF-8: the
    model's to correct, like any other bad argument."""
    try:
        payload = json.dumps(args, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        raise ToolError(
            "args hold text that is not valid Unicode (a lone surrogate such as \\ud83d); "
            "send the characters themselves."
        ) from None
    if len(payload) > MAX_ARGS_BYTES:
        raise ToolError(f"args are too large ({len(payload)} bytes; at most {MAX_ARGS_BYTES}).")
    return payload


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
    """Kill the script's whole session (it was started as a session leader, and the filter
    refuses setsid): its process group, and any group a child made (`timeout` makes one)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in _session_members(proc.pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _session_members(sid: int) -> list[int]:
    """The processes of session `sid`, from /proc (none where there is no /proc)."""
    members = []
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if len(fields) > 3 and int(fields[3]) == sid:  # after ")": state ppid pgrp session
            members.append(int(entry.name))
    return members


def _tail(err: bytes, lines: int = 3) -> str:
    """The last lines of stderr: for a traceback, where the error is named."""
    text = err.decode(errors="replace").strip().splitlines()
    return " | ".join(line.strip() for line in text[-lines:] if line.strip())
