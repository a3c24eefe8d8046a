"""Skills: discovery and summaries, load_skill, and run_skill_script's sandbox."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import re
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from core.agent import seccomp
from core.agent.skill_tools import LoadSkill, RunSkillScript
from core.agent.tools import ToolContext, ToolRegistry, ToolResult
from core.errors import ConfigError
from core.skills import discover_skills, parse_skill_md, session_workdir, skills_prompt

SHIPPED = Path(__file__).resolve().parent.parent / "config" / "skills"
KNOWLEDGE = Path(__file__).resolve().parent.parent / "config" / "knowledge"
CTX = ToolContext(session="web:visitor-1", run_id="r1")
ROOT_WITH_UNSHARE = os.geteuid() == 0 and Path("/usr/bin/unshare").is_file()


def make_skill(
    root: Path, name: str, script: str = "", *, network: bool = False, file: str = "run.py"
) -> Path:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    front = f"---\nname: {name}\nsummary: The {name} skill.\nnetwork: {str(network).lower()}\n---"
    (folder / "SKILL.md").write_text(f"{front}\n\n# {name}\n\nCall {file}.\n")
    if script:
        (folder / file).write_text(textwrap.dedent(script))
    return folder


async def run(tool: RunSkillScript, skill: str, script: str = "run.py", **args: Any) -> ToolResult:
    registry = ToolRegistry([tool])
    raw = json.dumps({"skill": skill, "script": script, "args": args})
    return await registry.call("run_skill_script", raw, CTX)


def detail(result: ToolResult) -> str:
    assert result.ok is False
    return str(json.loads(result.content)["detail"])


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie still answers: it is dead once its state says so
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ")[1].startswith("Z")


async def dies(pid: int) -> bool:
    """Whether pid is gone within 2 s: a killed process lets go of its pipes a moment before
    it is a zombie."""
    for _ in range(100):
        if gone(pid):
            return True
        await asyncio.sleep(0.02)
    return False


# -- discovery ------------------------------------------------------------------------------


def test_discovery_returns_summaries_sorted_by_name(tmp_path: Path) -> None:
    make_skill(tmp_path, "zeta")
    make_skill(tmp_path, "alpha", network=True)
    (tmp_path / "not-a-skill").mkdir()  # no SKILL.md: ignored
    skills = discover_skills(tmp_path)
    assert [(s.name, s.summary, s.network) for s in skills] == [
        ("alpha", "The alpha skill.", True),
        ("zeta", "The zeta skill.", False),
    ]
    assert skills[0].path == (tmp_path / "alpha").resolve()
    assert skills[0].instructions.startswith("---\nname: alpha")
    assert discover_skills(tmp_path / "missing") == []


def test_skills_prompt_shows_only_names_and_summaries(tmp_path: Path) -> None:
    make_skill(tmp_path, "alpha")
    prompt = skills_prompt(discover_skills(tmp_path))
    assert prompt.splitlines()[1:] == ["- alpha: The alpha skill."]
    assert "load_skill" in prompt
    assert "Call run.py" not in prompt  # the body waits for load_skill
    assert skills_prompt([]) == ""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("---\nname: x\ndescription: 'Quoted one.'\n---\nbody", ("x", "Quoted one.", False)),
        ('---\nsummary: "Says hi."\nnetwork: TRUE\n---\n', ("folder", "Says hi.", True)),
        ("# Title\n\nFirst line of text.\nMore.\n", ("folder", "First line of text.", False)),
        ("---\nsummary: s\nlicense: MIT\n# a comment\n---\n", ("folder", "s", False)),
        ("\ufeff---\nname: x\nsummary: s\nnetwork: true\n---\n", ("x", "s", True)),  # a BOM
        ("---\n---\nFirst line of text.\n", ("folder", "First line of text.", False)),
    ],
)
def test_parse_skill_md(text: str, expected: tuple[str, str, bool]) -> None:
    assert parse_skill_md(text, "folder") == expected


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("---\nname: Bad Name\nsummary: s\n---\n", "name"),
        ("---\nsummary: s\nnetwork: maybe\n---\n", "network"),
        ("# Only a heading\n", "no summary"),
        ("---\nsummary: " + "x" * 201 + "\n---\n", "one line"),
        ("---\nsummary: s\nnot a pair\n---\n", "key: value"),
        ("---\nname: x\nsummary: s\nnetwork: true\n# Body\n", "never closed"),
        ("---", "never closed"),
    ],
)
def test_parse_skill_md_rejects(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_skill_md(text, "folder")


def test_discovery_names_each_bad_skill_file(tmp_path: Path) -> None:
    make_skill(tmp_path, "good")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "SKILL.md").write_text("---\nsummary: s\nnetwork: 1\n---\n")
    make_skill(tmp_path, "copy")
    (tmp_path / "copy" / "SKILL.md").write_text("---\nname: good\nsummary: again\n---\n")
    with pytest.raises(ConfigError) as exc:
        discover_skills(tmp_path)
    keys = [key for key, _ in exc.value.problems]
    assert keys == [
        (tmp_path / "bad" / "SKILL.md").as_posix(),
        (tmp_path / "good/SKILL.md").as_posix(),
    ]
    assert "duplicate" in exc.value.problems[1][1]


def test_discovery_reads_front_matter_after_a_bom(tmp_path: Path) -> None:
    """Some editors start UTF-8 files with a byte order mark: the front matter still counts."""
    (tmp_path / "booking").mkdir()
    (tmp_path / "booking" / "SKILL.md").write_bytes(
        b"\xef\xbb\xbf---\nname: table-booking\nsummary: Books a table.\nnetwork: true\n---\n# B\n"
    )
    [skill] = discover_skills(tmp_path)
    assert (skill.name, skill.summary, skill.network) == ("table-booking", "Books a table.", True)
    assert skill.instructions.startswith("---\nname: table-booking")


def test_unclosed_front_matter_is_a_config_error(tmp_path: Path) -> None:
    """Read as body, its '---' would be the summary and `network: true` would be lost."""
    (tmp_path / "open").mkdir()
    (tmp_path / "open" / "SKILL.md").write_text("---\nsummary: s\nnetwork: true\n# Body\n")
    with pytest.raises(ConfigError) as exc:
        discover_skills(tmp_path)
    [(where, problem)] = exc.value.problems
    assert where == (tmp_path / "open" / "SKILL.md").as_posix()
    assert "never closed" in problem


def test_session_workdir_stays_inside_the_root(tmp_path: Path) -> None:
    a = session_workdir(tmp_path, "web:visitor-1")
    b = session_workdir(tmp_path, "web:visitor-2")
    evil = session_workdir(tmp_path, "../../etc/passwd")
    dots = session_workdir(tmp_path, "..")
    assert len({a, b, evil, dots}) == 4
    for path in (a, b, evil, dots):
        assert path.is_dir()
        assert path.parent == tmp_path.resolve()
    assert session_workdir(tmp_path, "web:visitor-1") == a


def test_the_shipped_skill_is_discovered() -> None:
    (skill,) = discover_skills(SHIPPED)
    assert skill.name == "rental-quote"
    assert skill.network is False
    assert skill.summary.startswith("Exact price quote for renting bikes")
    assert skill.scripts() == ["quote.py"]


# -- load_skill -----------------------------------------------------------------------------


async def test_load_skill_returns_the_full_skill_md(tmp_path: Path) -> None:
    make_skill(tmp_path, "alpha", "print(1)\n")
    (tmp_path / "alpha" / "lib").mkdir()
    (tmp_path / "alpha" / "lib" / "helper.py").write_text("")
    (tmp_path / "alpha" / "__pycache__").mkdir()
    (tmp_path / "alpha" / "__pycache__" / "x.py").write_text("")
    registry = ToolRegistry([LoadSkill(discover_skills(tmp_path))])

    result = await registry.call("load_skill", '{"name": "alpha"}', CTX)

    data = json.loads(result.content)
    assert data["skill_md"] == (tmp_path / "alpha" / "SKILL.md").read_text()
    assert data["scripts"] == ["lib/helper.py", "run.py"]
    missing = await registry.call("load_skill", '{"name": "beta"}', CTX)
    assert "Skills: alpha" in detail(missing)


# -- run_skill_script -----------------------------------------------------------------------


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return tmp_path / "workspace"


def tool_for(root: Path, workspace: Path, **kw: Any) -> RunSkillScript:
    return RunSkillScript(discover_skills(root), workspace, **kw)


async def test_rental_quote_happy_path(workspace: Path) -> None:
    tool = tool_for(SHIPPED, workspace)
    args = {"bike": "electric", "unit": "day", "count": 2, "bikes": 2, "extras": {"child_seat": 1}}
    result = await run(tool, "rental-quote", "quote.py", **args)
    assert result.ok is True, result.content
    data = json.loads(result.content)
    assert data["bike"] == "e-bike"
    assert [line["amount"] for line in data["lines"]] == [280, 10]  # 2 x 2 x $70; 2 days x $5
    assert data["total"] == 290
    assert data["deposit"] == 600
    assert data["currency"] == "USD"


async def test_rental_quote_hourly_extras_cost_one_day(workspace: Path) -> None:
    tool = tool_for(SHIPPED, workspace)
    result = await run(
        tool,
        "rental-quote",
        "quote.py",
        bike="kids",
        unit="hour",
        count=3,
        extras={"trailer": 1, "child_seat": 0},
    )
    data = json.loads(result.content)
    assert [line["amount"] for line in data["lines"]] == [24, 5]
    assert data["total"] == 29


async def test_rental_quote_wrong_argument_says_what_to_fix(workspace: Path) -> None:
    tool = tool_for(SHIPPED, workspace)
    result = await run(tool, "rental-quote", "quote.py", bike="tandem", unit="day", count=1)
    assert "unknown bike 'tandem'; choose one of: city, e-bike, kids" in detail(result)
    result = await run(tool, "rental-quote", "quote.py", bike="city", unit="day", count=0)
    assert "count must be a whole number" in detail(result)


def test_rental_prices_match_the_knowledge_base() -> None:
    prices = json.loads((SHIPPED / "rental-quote" / "prices.json").read_text())
    text = (KNOWLEDGE / "services-and-prices.md").read_text()
    for bike in prices["bikes"].values():
        p = bike["prices"]
        assert f"${p['hour']} per hour, ${p['day']} per day or ${p['week']} per week" in text
        assert f"${bike['deposit']} per" in text
    for extra in prices["extras"].values():
        assert f"${extra['per_day']} per day" in text


async def test_script_gets_stdin_args_and_the_session_folder(
    tmp_path: Path, workspace: Path
) -> None:
    make_skill(
        tmp_path,
        "echo",
        """
        import json, os, sys
        args = json.load(sys.stdin)
        open("note.txt", "w").write("kept")
        print(json.dumps({"args": args, "cwd": os.getcwd()}))
        """,
    )
    tool = tool_for(tmp_path, workspace)
    result = await run(tool, "echo", n=1, text="héllo")
    data = json.loads(result.content)
    assert data["args"] == {"n": 1, "text": "héllo"}
    folder = session_workdir(workspace, CTX.session)
    assert data["cwd"] == str(folder)
    assert (folder / "note.txt").read_text() == "kept"
    assert not (tmp_path / "echo" / "note.txt").exists()


async def test_the_runs_workspace_is_used_when_it_has_one(tmp_path: Path) -> None:
    make_skill(tmp_path, "cwd", "import json, os\nprint(json.dumps(os.getcwd()))\n")
    registry = ToolRegistry([RunSkillScript(discover_skills(tmp_path))])
    raw = '{"skill": "cwd", "script": "run.py"}'
    ctx = ToolContext(session="s", run_id="r", workspace=tmp_path / "ws" / "s")
    result = await registry.call("run_skill_script", raw, ctx)
    assert json.loads(result.content) == str(tmp_path / "ws" / "s" / "files")
    nowhere = await registry.call("run_skill_script", raw, CTX)
    assert "need a working folder" in detail(nowhere)


async def test_environment_carries_no_parent_secrets(
    tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("SWITCHBOARD_TEST_SECRET", "s3cret")
    make_skill(tmp_path, "env", "import json, os\nprint(json.dumps(dict(os.environ)))\n")
    result = await run(tool_for(tmp_path, workspace), "env")
    env = json.loads(result.content)
    assert "sk-secret" not in result.content
    assert "s3cret" not in result.content
    assert set(env) <= {"PATH", "LANG", "LC_ALL", "HOME", "TMPDIR", "SKILL_DIR", "LC_CTYPE"}
    assert env["SKILL_DIR"] == str((tmp_path / "env").resolve())


async def test_script_can_import_its_own_modules(tmp_path: Path, workspace: Path) -> None:
    folder = make_skill(tmp_path, "lib", "import json, helper\nprint(json.dumps(helper.X))\n")
    (folder / "helper.py").write_text("X = {'from': 'helper'}\n")
    result = await run(tool_for(tmp_path, workspace), "lib")
    assert json.loads(result.content) == {"from": "helper"}
    assert not (folder / "__pycache__").exists()  # -B: nothing written into the skill


async def test_timeout_kills_the_whole_process_group(tmp_path: Path, workspace: Path) -> None:
    make_skill(
        tmp_path,
        "slow",
        """
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open("pids", "w").write(f"{child.pid}")
        time.sleep(60)
        """,
    )
    result = await run(tool_for(tmp_path, workspace, timeout_s=1.0), "slow")
    assert "took longer than 1 s and was stopped" in detail(result)
    child = int((session_workdir(workspace, CTX.session) / "pids").read_text())
    assert await dies(child)


async def test_cancelled_run_leaves_no_process(tmp_path: Path, workspace: Path) -> None:
    make_skill(
        tmp_path,
        "hang",
        "import os, time\nopen('pid', 'w').write(str(os.getpid()))\ntime.sleep(60)\n",
    )
    task = asyncio.create_task(run(tool_for(tmp_path, workspace), "hang"))
    pid_file = session_workdir(workspace, CTX.session) / "pid"
    for _ in range(500):
        if pid_file.exists() and pid_file.read_text():
            break
        await asyncio.sleep(0.01)
    pid = int(pid_file.read_text())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert gone(pid)


async def test_memory_cap_is_enforced(tmp_path: Path, workspace: Path) -> None:
    make_skill(
        tmp_path,
        "hog",
        "import json\nblob = bytearray(512 * 1024 * 1024)\nprint(json.dumps(len(blob)))\n",
    )
    result = await run(tool_for(tmp_path, workspace, memory_mb=128), "hog")
    assert "MemoryError" in detail(result)
    assert "failed (exit 1)" in detail(result)


async def test_memory_under_the_cap_is_fine(tmp_path: Path, workspace: Path) -> None:
    make_skill(
        tmp_path,
        "ok",
        "import json\nblob = bytearray(16 * 1024 * 1024)\nprint(json.dumps(len(blob)))\n",
    )
    result = await run(tool_for(tmp_path, workspace, memory_mb=128), "ok")
    assert json.loads(result.content) == 16 * 1024 * 1024


@pytest_asyncio.fixture
async def tcp_server() -> AsyncIterator[tuple[int, list[bytes]]]:
    """A local server answering 'pong'; it records what each connection sent."""
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.read(100))
        writer.write(b"pong")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield port, seen
    server.close()
    await server.wait_closed()


CLIENT = """
import json, socket, sys
port = json.load(sys.stdin)["port"]
with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
    s.sendall(b"ping")
    print(json.dumps({"reply": s.recv(100).decode()}))
"""


async def test_network_is_refused_without_declaration(
    tmp_path: Path, workspace: Path, tcp_server: tuple[int, list[bytes]]
) -> None:
    port, seen = tcp_server
    make_skill(tmp_path, "offline", CLIENT)
    result = await run(tool_for(tmp_path, workspace), "offline", port=port)
    assert "PermissionError: network access is not allowed for this skill" in detail(result)
    await asyncio.sleep(0.05)
    assert seen == []


async def test_network_is_allowed_when_declared(
    tmp_path: Path, workspace: Path, tcp_server: tuple[int, list[bytes]]
) -> None:
    port, seen = tcp_server
    make_skill(tmp_path, "online", CLIENT, network=True)
    result = await run(tool_for(tmp_path, workspace), "online", port=port)
    assert json.loads(result.content) == {"reply": "pong"}
    assert seen == [b"ping"]


async def test_raw_socket_bypass_meets_an_empty_network_namespace(
    tmp_path: Path, workspace: Path, tcp_server: tuple[int, list[bytes]]
) -> None:
    """Code that skips the socket module (here _socket) is stopped by the namespace layer
    (seccomp, the layer before it, is switched off here)."""
    port, seen = tcp_server
    make_skill(
        tmp_path,
        "sneaky",
        """
        import _socket, json, sys
        port = json.load(sys.stdin)["port"]
        s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
        s.connect(("127.0.0.1", port))
        print(json.dumps("connected"))
        """,
    )
    tool = tool_for(tmp_path, workspace)
    tool._seccomp = False
    if "netns" not in await tool.isolation():
        pytest.skip("unshare cannot create a network namespace on this machine")
    result = await run(tool, "sneaky", port=port)
    assert re.search(r"OSError|unreachable", detail(result))
    assert seen == []


def without_netns(tool: RunSkillScript) -> RunSkillScript:
    """As in a container, where unshare is refused: seccomp is the layer that holds."""
    tool._sandbox = ()
    return tool


@pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64"), reason="no filter here")
@pytest.mark.parametrize(
    "script",
    [
        """
        import _socket, json, sys
        s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
        s.connect(("127.0.0.1", json.load(sys.stdin)["port"]))
        print(json.dumps("connected"))
        """,
        """
        import json, subprocess, sys
        port = json.load(sys.stdin)["port"]
        client = f"import socket; socket.create_connection(('127.0.0.1', {port})).sendall(b'hi')"
        done = subprocess.run([sys.executable, "-c", client], capture_output=True, text=True)
        print(json.dumps(done.stderr)) if done.returncode == 0 else sys.exit(done.stderr)
        """,
    ],
    ids=["_socket", "a child process"],
)
async def test_socket_bypasses_are_refused_without_a_network_namespace(
    tmp_path: Path, workspace: Path, tcp_server: tuple[int, list[bytes]], script: str
) -> None:
    port, seen = tcp_server
    make_skill(tmp_path, "sneaky", script)
    tool = without_netns(tool_for(tmp_path, workspace))
    assert await tool.isolation() == {"bootstrap", "seccomp"}
    result = await run(tool, "sneaky", port=port)
    assert "Operation not permitted" in detail(result)
    await asyncio.sleep(0.05)
    assert seen == []


@pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64"), reason="no filter here")
@pytest.mark.parametrize("network", [False, True])
async def test_a_child_cannot_leave_the_process_group_to_outlive_the_call(
    tmp_path: Path, workspace: Path, network: bool
) -> None:
    """A double fork with setsid, the daemon's way out of a killpg."""
    make_skill(
        tmp_path,
        "daemon",
        """
        import json, os, time
        if os.fork() == 0:
            try:
                os.setsid()
            except OSError as exc:
                open("setsid", "w").write(exc.strerror)
            if os.fork() == 0:
                while True:
                    open("beat", "w").write(str(time.time()))
                    time.sleep(0.05)
            os._exit(0)
        while not os.path.exists("beat"):
            time.sleep(0.01)
        print(json.dumps({"ok": True}))
        """,
        network=network,
    )
    tool = without_netns(tool_for(tmp_path, workspace))
    result = await run(tool, "daemon")
    assert json.loads(result.content) == {"ok": True}
    folder = session_workdir(workspace, CTX.session)
    assert (folder / "setsid").read_text() == "Operation not permitted"
    await asyncio.sleep(0.3)
    last = (folder / "beat").read_text()
    await asyncio.sleep(0.3)
    assert (folder / "beat").read_text() == last  # nobody writes it any more


@pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64"), reason="no filter here")
async def test_process_groups_work_and_a_child_in_its_own_group_is_killed_too(
    tmp_path: Path, workspace: Path
) -> None:
    """`timeout` makes its own process group (refusing setpgid broke it); a child that moves to
    a new group stays in the script's session, which is killed whole."""
    make_skill(
        tmp_path,
        "groups",
        """
        import json, os, subprocess, sys, time
        rc = subprocess.run(["timeout", "0.5", "sleep", "3"]).returncode
        if os.fork() == 0:
            os.setpgid(0, 0)
            while True:
                open("beat", "w").write(str(time.time()))
                time.sleep(0.05)
        while not os.path.exists("beat"):
            time.sleep(0.01)
        print(json.dumps({"timeout": rc}))
        """,
    )
    result = await run(without_netns(tool_for(tmp_path, workspace)), "groups")
    assert json.loads(result.content) == {"timeout": 124}
    folder = session_workdir(workspace, CTX.session)
    await asyncio.sleep(0.3)
    last = (folder / "beat").read_text()
    await asyncio.sleep(0.3)
    assert (folder / "beat").read_text() == last


@pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64"), reason="no filter here")
async def test_a_script_cannot_reach_into_the_gateway(tmp_path: Path, workspace: Path) -> None:
    """pidfd_getfd copied the gateway's open sockets (its database and platform connections)
    into a script, network or not."""
    make_skill(
        tmp_path,
        "reach",
        """
        import ctypes, json, os
        libc = ctypes.CDLL(None, use_errno=True)
        parent = os.getppid()
        ptrace = 101 if os.uname().machine == "x86_64" else 117
        tried = {}
        for name, call in (("pidfd_open", (434, parent, 0)), ("ptrace", (ptrace, 16, parent))):
            libc.syscall(*call, 0, 0)  # PTRACE_ATTACH is 16
            tried[name] = ctypes.get_errno()
        print(json.dumps(tried))
        """,
        network=True,
    )
    result = await run(tool_for(tmp_path, workspace), "reach")
    assert json.loads(result.content) == {"pidfd_open": 1, "ptrace": 1}  # EPERM


def test_the_filter_exists_only_for_known_machines() -> None:
    assert seccomp.program(network=False, machine="riscv64") is None
    for machine in ("x86_64", "aarch64"):
        closed = seccomp.program(network=False, machine=machine)
        opened = seccomp.program(network=True, machine=machine)
        assert closed is not None
        assert opened is not None
        assert len(closed) % 8 == 0
        assert len(closed) > len(opened)  # the socket check


@pytest.mark.parametrize(
    "script",
    [
        "../outside/evil.py",
        "/etc/passwd",
        "link.py",
        "data.json",
        "missing.py",
        "sub/../../outside/evil.py",
        "run.py\x00",  # a NUL byte: no path at all
    ],
)
async def test_paths_outside_the_skill_are_refused(
    tmp_path: Path, workspace: Path, script: str
) -> None:
    skills = tmp_path / "skills"
    folder = make_skill(skills, "safe", "print(1)\n")
    (folder / "data.json").write_text("{}")
    (folder / "sub").mkdir()
    outside = tmp_path / "skills" / "outside"  # a folder, not a skill
    outside.mkdir()
    (outside / "evil.py").write_text("open('ran', 'w').write('yes')\n")
    (folder / "link.py").symlink_to(outside / "evil.py")
    result = await run(tool_for(skills, workspace), "safe", script)
    assert f"safe has no script {script!r}. Scripts: run.py." in detail(result)
    assert not (session_workdir(workspace, CTX.session) / "ran").exists()


async def test_unknown_skill_is_an_error_result(tmp_path: Path, workspace: Path) -> None:
    make_skill(tmp_path, "alpha", "print(1)\n")
    result = await run(tool_for(tmp_path, workspace), "beta")
    assert detail(result) == "There is no skill named 'beta'. Skills: alpha."


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("print('not json')\n", "did not print JSON. It printed: not json"),
        (
            "import sys\nprint('half', file=sys.stderr)\nprint('{')\n",
            "did not print JSON. It printed: half",
        ),
        ("pass\n", "did not print JSON. It printed: nothing"),
        ("raise RuntimeError('boom')\n", "failed (exit 1): "),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", "was killed (signal 9)"),
    ],
)
async def test_bad_output_and_crashes_are_error_results(
    tmp_path: Path, workspace: Path, body: str, expected: str
) -> None:
    make_skill(tmp_path, "bad", body)
    result = await run(tool_for(tmp_path, workspace), "bad")
    assert expected in detail(result)
    assert result.error == "failed"


async def test_crash_detail_ends_with_the_exception(tmp_path: Path, workspace: Path) -> None:
    make_skill(tmp_path, "bad", "def f():\n    raise RuntimeError('boom')\nf()\n")
    result = await run(tool_for(tmp_path, workspace), "bad")
    assert detail(result).endswith("RuntimeError: boom")


async def test_output_is_capped(
    tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_skill(
        tmp_path,
        "loud",
        "import sys, time\nsys.stdout.write('x' * 200_000)\nsys.stdout.flush()\ntime.sleep(30)\n",
    )
    spawned: list[asyncio.subprocess.Process] = []
    spawn = asyncio.create_subprocess_exec

    async def spy(*args: Any, **kwargs: Any) -> asyncio.subprocess.Process:
        spawned.append(await spawn(*args, **kwargs))
        return spawned[-1]

    monkeypatch.setattr(asyncio, "create_subprocess_exec", spy)
    result = await run(tool_for(tmp_path, workspace, max_output_bytes=1000), "loud")
    assert "printed more than 1000 bytes and was stopped" in detail(result)
    script = spawned[-1]
    # its unread output is drained, so the pipe closes now, not when collected (a
    # ResourceWarning in whatever test then runs the collector)
    assert script.stdout is not None
    assert script.stdout.at_eof()


async def test_args_with_a_lone_surrogate_are_an_error_result(
    tmp_path: Path, workspace: Path
) -> None:
    """Valid JSON ("\\ud83d"), but no UTF-8 can carry it to the script: the model must fix it."""
    make_skill(tmp_path, "echo", "print(1)\n")
    result = await run(tool_for(tmp_path, workspace), "echo", bike="\ud83d")
    assert "not valid Unicode (a lone surrogate" in detail(result)


async def test_oversized_args_are_refused(tmp_path: Path, workspace: Path) -> None:
    make_skill(tmp_path, "echo", "print(1)\n")
    result = await run(tool_for(tmp_path, workspace), "echo", blob="x" * 70_000)
    assert "args are too large" in detail(result)


LEAVES_A_CHILD = """
import json, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
open("child", "w").write(str(child.pid))
{end}
"""


@pytest.mark.parametrize(
    ("end", "outcome"),
    [
        ("print(json.dumps({'quote': 80}))", '{"quote": 80}'),
        ("sys.exit('no such bike')", "failed (exit 1): no such bike"),
    ],
)
async def test_a_child_left_running_neither_delays_nor_outlives_the_script(
    tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch, end: str, outcome: str
) -> None:
    """The child holds the pipes open: the script's exit, not their end, ends the call, and the
    process group is killed even though the script itself has already exited."""
    make_skill(tmp_path, "bg", LEAVES_A_CHILD.format(end=end))
    spawned: list[asyncio.subprocess.Process] = []
    spawn = asyncio.create_subprocess_exec

    async def spy(*args: Any, **kwargs: Any) -> asyncio.subprocess.Process:
        spawned.append(await spawn(*args, **kwargs))
        return spawned[-1]

    monkeypatch.setattr(asyncio, "create_subprocess_exec", spy)
    result = await run(tool_for(tmp_path, workspace, timeout_s=5.0), "bg")
    assert outcome in (result.content if result.ok else detail(result))
    assert await dies(int((session_workdir(workspace, CTX.session) / "child").read_text()))
    script = spawned[-1]
    assert script.stdout is not None
    assert script.stdout.at_eof()  # its pipes are closed now, not by the garbage collector


def test_run_timeout_must_fit_under_the_tool_timeout(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        RunSkillScript([], tmp_path, timeout_s=RunSkillScript.timeout_s)


async def test_script_runs_in_its_own_process_group(tmp_path: Path, workspace: Path) -> None:
    """The script leads its own process group and session, so the group kill hits only it."""
    make_skill(
        tmp_path,
        "pg",
        "import json, os\nprint(json.dumps([os.getpid(), os.getpgid(0), os.getsid(0)]))\n",
    )
    pid, pgid, sid = json.loads((await run(tool_for(tmp_path, workspace), "pg")).content)
    assert pid == pgid == sid
    assert pgid != os.getpgid(0)


@pytest.mark.skipif(not ROOT_WITH_UNSHARE, reason="needs root and /usr/bin/unshare")
async def test_root_with_unshare_gets_a_network_namespace(tmp_path: Path) -> None:
    """Where CI runs (root, util-linux, x86_64), every layer must be found, not silently lost."""
    assert await RunSkillScript([], tmp_path).isolation() == {"bootstrap", "seccomp", "netns"}
