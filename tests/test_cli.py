"""The real CLI in subprocesses: `check`, `run` and `chat`, exit codes and messages by key."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import io
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from channels.console import Console
from core.errors import StoreError
from core.models import OutboundPart, Reply, SessionKey
from core.sessions import RESET_REPLY
from gateway import cli as cli_module
from gateway.cli import GC_YOUNG_THRESHOLD, settle_heap
from tests.conftest import PG_BASE
from tests.fake_openai import FakeOpenAI, Text

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "config" / "switchboard.example.toml"
MAX_BODY = 2048

BAD_TOML = """
[server]
prot = 8080

[agent]
queue_mode = "lifo"

[agent.limits]
max_steps = 0
"""
BAD_KEYS = ("server.prot", "agent.queue_mode", "agent.limits.max_steps")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD__")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def cli(
    *args: str,
    env: dict[str, str] | None = None,
    stdin: str | None = None,
    timeout: float = 20,
    cwd: Path = ROOT,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        cwd=cwd,
        env=env if env is not None else clean_env(),
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def good_config(tmp_path: Path, port: int = 8080) -> Path:
    path = tmp_path / "good.toml"
    path.write_text(
        f'[server]\nhost = "127.0.0.1"\nport = {port}\nmax_body_bytes = {MAX_BODY}\n'
        f'[store]\nurl = "sqlite:///{tmp_path}/db.sqlite"\n',
        encoding="utf-8",
    )
    return path


def chat_process(tmp_path: Path, **popen: Any) -> subprocess.Popen[str]:
    """`switchboard chat` on the good config, its stdin and stderr piped, as text."""
    return subprocess.Popen(
        [sys.executable, "-m", "gateway", "chat", "--config", str(good_config(tmp_path))],
        cwd=ROOT,
        env=clean_env(),
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


def assert_no_traceback(proc: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in proc.stderr
    assert "Traceback" not in proc.stdout


# check


def test_check_on_the_example_is_ok() -> None:
    proc = cli("check", "--config", str(EXAMPLE))
    assert proc.returncode == 0, proc.stderr
    assert "config ok" in proc.stdout
    assert "switchboard.example.toml" in proc.stdout
    assert "web chat: http://127.0.0.1:8080/" in proc.stdout
    assert_no_traceback(proc)


def test_check_names_the_web_chat_only_when_it_is_served(tmp_path: Path) -> None:
    path = tmp_path / "no-web.toml"
    path.write_text("[channels.web]\nenabled = false\n", encoding="utf-8")
    proc = cli("check", "--config", str(path), "--offline")
    assert proc.returncode == 0, proc.stderr
    assert "web chat" not in proc.stdout


def test_check_reports_every_problem_by_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(BAD_TOML, encoding="utf-8")
    proc = cli("check", "--config", str(bad))
    assert proc.returncode == 2
    assert "config ok" not in proc.stdout
    for key in BAD_KEYS:
        assert f"{key}:" in proc.stderr
    assert "unknown key" in proc.stderr
    assert_no_traceback(proc)


def test_check_on_a_missing_file_and_invalid_toml(tmp_path: Path) -> None:
    missing = cli("check", "--config", str(tmp_path / "nope.toml"))
    assert missing.returncode == 2
    assert "config:" in missing.stderr
    assert "nope.toml" in missing.stderr
    assert_no_traceback(missing)

    broken = tmp_path / "broken.toml"
    broken.write_text("[server\n", encoding="utf-8")
    proc = cli("check", "--config", str(broken))
    assert proc.returncode == 2
    assert "config:" in proc.stderr
    assert_no_traceback(proc)


def test_run_with_a_bad_config_exits_2_with_the_same_messages(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(BAD_TOML, encoding="utf-8")
    check = cli("check", "--config", str(bad))
    proc = cli("run", "--config", str(bad), "--log-format", "text")
    assert proc.returncode == 2
    for key in BAD_KEYS:
        assert f"{key}:" in proc.stderr
    assert proc.stderr == check.stderr
    assert "serving" not in proc.stdout
    assert_no_traceback(proc)


def test_run_reports_config_errors_as_json_lines_where_the_log_is_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """deploy/README.md promises JSON lines on stderr: run's configuration errors were a
    plain heading and indented lines, and a store it could not open "error: store.url: …"."""
    bad = tmp_path / "bad.toml"
    bad.write_text(BAD_TOML, encoding="utf-8")
    monkeypatch.setenv("SWITCHBOARD_LOG_FORMAT", "json")
    assert cli_module.main(["run", "--config", str(bad)]) == 2
    entries = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert len(entries) == len(BAD_KEYS)  # one object per problem
    for key in BAD_KEYS:
        assert any(f": {key}: " in e["msg"] and e["level"] == "error" for e in entries), key

    def unopenable(_: object) -> None:
        raise StoreError('cannot open PostgreSQL store: database "nodb" does not exist')

    monkeypatch.setattr(cli_module, "build_app", unopenable)
    assert cli_module.main(["run", "--config", str(good_config(tmp_path, free_port()))]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert json.loads(line)["msg"].startswith(
        'error: store.url: cannot open PostgreSQL store: database "nodb"'
    )


def test_env_override_error_exits_2_naming_the_key() -> None:
    env = clean_env(SWITCHBOARD__AGENT__LIMITS__MAX_STEPS="0")
    for command in ("check", "run"):
        proc = cli(command, "--config", str(EXAMPLE), env=env)
        assert proc.returncode == 2, (command, proc.stdout, proc.stderr)
        assert "agent.limits.max_steps" in proc.stderr
        assert_no_traceback(proc)


def test_check_never_prints_secrets(tmp_path: Path) -> None:
    path = tmp_path / "tg.toml"
    path.write_text(
        '[channels.telegram]\nenabled = true\nmode = "polling"\ntoken = "123:abc"\n',
        encoding="utf-8",
    )
    proc = cli("check", "--config", str(path), "--offline")
    assert proc.returncode == 0, proc.stderr
    assert "telegram" in proc.stdout
    assert "123:abc" not in proc.stdout + proc.stderr  # secrets are never printed


def test_check_reports_a_missing_variable_with_every_other_problem(tmp_path: Path) -> None:
    bad = tmp_path / "multi.toml"
    bad.write_text(
        '[server]\nbogus = 1\n[model]\napi_key = "${SB_TEST_UNSET_ABC}"\n'
        '[agent.limits]\nmax_steps = "x"\n',
        encoding="utf-8",
    )
    proc = cli("check", "--offline", "--config", str(bad))
    assert proc.returncode == 2
    for key in ("model.api_key", "server.bogus", "agent.limits.max_steps"):
        assert f"  {key}: " in proc.stderr
    assert "SB_TEST_UNSET_ABC is not set" in proc.stderr
    assert_no_traceback(proc)


def test_check_offline_rejects_a_host_that_is_no_address_or_name(tmp_path: Path) -> None:
    env = clean_env(SWITCHBOARD__SERVER__HOST="999.1.1.1")
    config = str(good_config(tmp_path))
    for args in (("check", "--offline"), ("run",)):
        proc = cli(*args, "--config", config, env=env)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert "server.host: '999.1.1.1'" in proc.stderr
        assert "SWITCHBOARD__SERVER__HOST" in proc.stderr
        assert "config ok" not in proc.stdout
        assert_no_traceback(proc)


def unresolvable(monkeypatch: pytest.MonkeyPatch) -> None:
    """No DNS in tests: the resolver answers that the name does not exist."""

    def getaddrinfo(host: str, *_: object, **__: object) -> list[object]:
        assert host == "nowhere.example"
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(cli_module.socket, "getaddrinfo", getaddrinfo)


def test_check_online_rejects_a_host_name_that_does_not_resolve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    unresolvable(monkeypatch)
    monkeypatch.setenv("SWITCHBOARD__SERVER__HOST", "nowhere.example")
    config = str(good_config(tmp_path))
    assert cli_module.main(["check", "--config", config]) == 2
    out = capsys.readouterr()
    assert "server.host: cannot resolve 'nowhere.example'" in out.err
    assert "config ok" not in out.out
    assert cli_module.main(["check", "--offline", "--config", config]) == 0  # no resolver


def test_run_with_a_host_name_that_does_not_resolve_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    unresolvable(monkeypatch)
    monkeypatch.setattr(cli_module.web, "run_app", lambda *_, **__: pytest.fail("served"))
    monkeypatch.setenv("SWITCHBOARD__SERVER__HOST", "nowhere.example")
    config = str(good_config(tmp_path))
    assert cli_module.main(["run", "--config", config, "--log-format", "text"]) == 2
    err = capsys.readouterr().err
    assert "server.host: cannot resolve 'nowhere.example'" in err
    assert err.rstrip().endswith("(from SWITCHBOARD__SERVER__HOST)")  # the README's promise


def test_run_on_a_port_in_use_exits_2_naming_server_port(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = cli("run", "--config", str(good_config(tmp_path, port)))
        from_env = cli(
            "run",
            "--config",
            str(good_config(tmp_path)),
            env=clean_env(SWITCHBOARD__SERVER__PORT=str(port)),
        )
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert f"server.port: {port} is already in use on 127.0.0.1" in proc.stderr
    assert "serving" not in proc.stdout
    assert_no_traceback(proc)
    assert from_env.returncode == 2
    assert "(from SWITCHBOARD__SERVER__PORT)" in from_env.stderr


def test_run_on_an_address_this_machine_does_not_have_exits_2(tmp_path: Path) -> None:
    env = clean_env(SWITCHBOARD__SERVER__HOST="192.0.2.1")  # TEST-NET-1: nobody's address
    proc = cli("run", "--config", str(good_config(tmp_path, free_port())), env=env)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "server.host: 192.0.2.1 is not an address of this machine" in proc.stderr
    assert_no_traceback(proc)


def test_check_refuses_what_run_refuses_and_notes_a_port_in_use(tmp_path: Path) -> None:
    """check said "config ok" where run then exited 2: an address this machine does not
    have, a store URL naming a folder. A port in use is only noted: the gateway this check
    comes before a restart of listens there."""
    config = str(good_config(tmp_path, free_port()))
    elsewhere = cli(
        "check", "--config", config, env=clean_env(SWITCHBOARD__SERVER__HOST="192.0.2.1")
    )
    assert elsewhere.returncode == 2, (elsewhere.stdout, elsewhere.stderr)
    assert "server.host: 192.0.2.1 is not an address of this machine" in elsewhere.stderr
    folder = clean_env(SWITCHBOARD__STORE__URL=f"sqlite:///{tmp_path}")
    for command in (("check", "--offline"), ("run",)):
        proc = cli(*command, "--config", config, env=folder)
        assert proc.returncode == 2, (proc.stdout, proc.stderr)
        assert f"store.url: {tmp_path} is a folder; name the database file in it" in proc.stderr
        assert_no_traceback(proc)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = cli("check", "--config", str(good_config(tmp_path, port)))
    assert busy.returncode == 0, (busy.stdout, busy.stderr)
    assert f"note: server.port: {port} is already in use" in busy.stderr


def test_chat_with_stdin_closed_says_so(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "chat", "--config", str(good_config(tmp_path))],
        cwd=ROOT,
        env=clean_env(),
        stdin=subprocess.DEVNULL,
        preexec_fn=lambda: os.close(0),  # as `<&-` leaves it
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    assert "stdin, which is closed" in proc.stderr
    assert_no_traceback(proc)


def test_env_list_keys_pass_check(tmp_path: Path) -> None:
    for value in ("U1,U2", '["U1","U2"]'):
        env = clean_env(
            SWITCHBOARD__CHANNELS__SLACK__ALLOW_FROM=value,
            SWITCHBOARD__CHANNELS__WEB__BLOCK_FROM=value,
        )
        proc = cli("check", "--offline", "--config", str(good_config(tmp_path)), env=env)
        assert proc.returncode == 0, (value, proc.stderr)


def test_an_unknown_section_from_the_environment_names_the_variable() -> None:
    proc = cli(
        "check", "--offline", "--config", str(EXAMPLE), env=clean_env(SWITCHBOARD__BOGUS__X="1")
    )
    assert proc.returncode == 2
    assert "bogus: unknown key (from SWITCHBOARD__BOGUS__X)" in proc.stderr


# run


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = free_port()
    config = good_config(tmp_path, port)
    log = (tmp_path / "server.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "run", "--config", str(config)],
        cwd=ROOT,
        env=clean_env(),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 10
        while True:
            if proc.poll() is not None:
                pytest.fail(f"server exited early: {(tmp_path / 'server.log').read_text()}")
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"server not healthy in 10 s: {(tmp_path / 'server.log').read_text()}")
            time.sleep(0.1)
        yield proc, base
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        log.close()


def test_run_serves_the_routes_and_stops_on_sigterm(
    server: tuple[subprocess.Popen[bytes], str], tmp_path: Path
) -> None:
    proc, base = server
    with httpx.Client(base_url=base, timeout=5) as http:
        health = http.get("/healthz")
        assert health.status_code == 200
        assert health.json()["status"] == "ok"

        ready = http.get("/readyz")
        assert ready.status_code == 200
        assert ready.json()["status"] == "ready"

        page = http.get("/")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        assert "<html" in page.text.lower()
        assert "switchboard_chat=" in page.headers["set-cookie"]

        metrics = http.get("/metrics")
        assert metrics.status_code == 200
        assert metrics.headers["content-type"].startswith("text/plain")
        assert "# TYPE switchboard_active_sessions gauge" in metrics.text

        big = http.post(
            "/chat/messages",
            content=b'{"text": "' + b"x" * (MAX_BODY * 2) + b'", "client_id": "c1"}',
            headers={"content-type": "application/json"},
        )
        assert big.status_code == 413
        assert "error" in big.json()

        malformed = http.post(
            "/chat/messages", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert malformed.status_code == 400
        assert "error" in malformed.json()

        no_client_id = http.post("/chat/messages", json={"text": "hi"})
        assert no_client_id.status_code == 400
        assert "client_id" in no_client_id.json()["error"]

        ok = http.post("/chat/messages", json={"text": "when are you open?", "client_id": "c-1"})
        assert ok.status_code == 202
        assert ok.json()["accepted"] is True
        deadline = time.monotonic() + 10  # the turn finishes before we stop the server
        while True:
            messages = http.get("/chat/history").json()["messages"]
            if any(m["role"] == "assistant" for m in messages):
                break
            assert time.monotonic() < deadline, messages
            time.sleep(0.1)
        assert "Monday" in messages[-1]["text"]

    assert (tmp_path / "db.sqlite").is_file()  # the configured store, not the default one
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    assert "Traceback" not in (tmp_path / "server.log").read_text()


async def test_a_second_signal_during_the_drain_stops_at_once_and_loses_nothing(
    tmp_path: Path, fake_openai: FakeOpenAI
) -> None:
    """A second SIGTERM (or Ctrl+C) while a turn drains: exit 0 with a word in the log, not a
    silent status 1; the message stays stored and the next start answers it."""
    fake_openai.responder = lambda body: Text("late answer", delay_s=30)
    port = free_port()
    config = good_config(tmp_path, port)
    config.write_text(
        config.read_text().replace("[server]\n", "[server]\nshutdown_grace_s = 20\n")
        + f'[model]\nprovider = "openai"\nbase_url = "{fake_openai.url}"\nname = "m"\n'
    )
    base = f"http://127.0.0.1:{port}"

    async def start() -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gateway",
            "--log-format",
            "text",
            "run",
            "--config",
            str(config),
            cwd=ROOT,
            env=clean_env(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        async with httpx.AsyncClient(base_url=base, timeout=1) as http:
            for _ in range(100):
                with contextlib.suppress(httpx.TransportError):
                    if (await http.get("/healthz")).status_code == 200:
                        return proc
                await asyncio.sleep(0.1)
        proc.kill()
        pytest.fail("the gateway did not start")

    proc = await start()
    async with httpx.AsyncClient(base_url=base, timeout=5) as http:
        await http.get("/")
        assert (
            await http.post("/chat/messages", json={"text": "hi", "client_id": "c1"})
        ).status_code == 202
        while not fake_openai.requests:  # the turn is waiting for the model
            await asyncio.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(proc.communicate(), 10)
        assert proc.returncode == 0, output
        assert b"stopped by a second signal" in output
        assert b"Traceback" not in output
        fake_openai.responder = lambda body: Text("answered after the restart")
        proc = await start()
        try:
            for _ in range(100):
                replies = [
                    m["text"]
                    for m in (await http.get("/chat/history")).json()["messages"]
                    if m["role"] == "assistant"
                ]
                if replies:
                    break
                await asyncio.sleep(0.1)
            assert replies == ["answered after the restart"]
        finally:
            proc.send_signal(signal.SIGTERM)
            await proc.wait()


def test_run_rejects_oversized_chunked_body(server: tuple[subprocess.Popen[bytes], str]) -> None:
    _, base = server

    def chunks() -> Iterator[bytes]:
        yield b'{"text": "'
        for _ in range(8):
            yield b"y" * 1024
        yield b'", "client_id": "c2"}'

    with httpx.Client(base_url=base, timeout=5) as http:
        response = http.post(
            "/chat/messages", content=chunks(), headers={"content-type": "application/json"}
        )
    assert response.status_code == 413
    assert "error" in response.json()


# chat


def test_chat_answers_from_the_knowledge_base(tmp_path: Path) -> None:
    proc = cli(
        "chat", "--config", str(good_config(tmp_path)), stdin="what are your opening hours?\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert "Monday" in proc.stdout
    assert_no_traceback(proc)


def test_chat_whose_output_is_closed_ends(tmp_path: Path) -> None:
    """`switchboard chat | head -c 20` never ended: each reply was retried for a day and
    the chat waited for it, logging a traceback per streamed word."""
    proc = chat_process(tmp_path, stdout=subprocess.PIPE)
    assert proc.stdin is not None
    assert proc.stdout is not None
    assert proc.stderr is not None
    proc.stdin.write("what are your opening hours?\n")
    proc.stdin.flush()
    assert proc.stdout.read(5) == "agent"
    proc.stdout.close()  # as head does once it has its bytes
    proc.stdin.write("and on holidays?\n")
    proc.stdin.close()
    try:
        assert proc.wait(timeout=60) == 1
    finally:
        proc.kill()
    err = proc.stderr.read()
    proc.stderr.close()
    assert "Traceback" not in err
    assert "the terminal's output is closed" in err


async def test_a_log_line_starts_on_a_line_of_its_own_and_the_answer_ends_once() -> None:
    """The run's "ok" log line came stuck to the answer's last word (written to the same
    terminal before the reply's send ended the line)."""
    screen = io.StringIO()
    console = Console("you", out=screen)
    handler = logging.StreamHandler(screen)
    handler.addFilter(cli_module._before_each(console.end_line))
    logger = logging.getLogger("test.console")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        k = SessionKey("default", "console", "default", "you")
        await console.run_started(k, "r1", console.parse("hi") or pytest.fail("no message"))
        await console.run_delta(k, "r1", "Hello ")
        await console.run_delta(k, "r1", "there")
        logger.warning("run r1 ok")
        part = OutboundPart(
            id=1, session=str(k), run_id="r1", seq=0, reply=Reply(text="Hello there")
        )
        await console.send(k, part)
    finally:
        logger.removeHandler(handler)
    assert screen.getvalue() == "agent> Hello there\nrun r1 ok\n"


def test_chat_reset_command(tmp_path: Path) -> None:
    proc = cli("chat", "--config", str(good_config(tmp_path)), stdin="/reset\n")
    assert proc.returncode == 0, proc.stderr
    assert RESET_REPLY in proc.stdout
    assert "Monday" not in proc.stdout
    assert_no_traceback(proc)


def test_chat_reads_bytes_that_are_not_utf8_as_replacement_characters(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "chat", "--config", str(good_config(tmp_path))],
        cwd=ROOT,
        env=clean_env(LANG="C.UTF-8"),
        input=b"caf\xe9 opening hours?\n",
        capture_output=True,
        timeout=20,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert b"Monday" in proc.stdout
    assert b"Traceback" not in proc.stderr


def test_outside_the_checkout_without_a_config_the_error_says_no_file_was_found(
    tmp_path: Path,
) -> None:
    proc = cli("check", "--offline", cwd=tmp_path, env=clean_env(PYTHONPATH=str(ROOT)))
    assert proc.returncode == 2
    assert "no file: neither config/switchboard.toml nor" in proc.stderr
    assert_no_traceback(proc)


@pytest.mark.parametrize("broken", ["a directory", "a dangling link"])
def test_a_broken_config_switchboard_toml_is_reported_not_replaced_by_the_example(
    tmp_path: Path, broken: str
) -> None:
    """A container mount of a missing host file makes a directory there: the gateway quietly
    served the shipped example (the demo bike shop) in its place."""
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "switchboard.example.toml").write_text("[server]\nport = 8080\n")
    target = tmp_path / "config" / "switchboard.toml"
    if broken == "a directory":
        target.mkdir()
    else:
        target.symlink_to(tmp_path / "nowhere.toml")
    proc = cli("check", "--offline", cwd=tmp_path, env=clean_env(PYTHONPATH=str(ROOT)))
    assert proc.returncode == 2
    assert "config/switchboard.toml" in proc.stderr
    assert "example" not in proc.stdout
    assert_no_traceback(proc)


def test_log_options_may_follow_the_command_in_any_case(tmp_path: Path) -> None:
    after = cli("check", "--offline", "--log-level", "debug", "--log-format", "JSON")
    assert after.returncode == 0, after.stderr
    config = str(good_config(tmp_path))
    for command in (["pairing", "list"], ["pairing", "approve", "X1"], ["telegram", "set-webhook"]):
        proc = cli(*command, "--config", config, "--log-level", "debug", "--log-format", "json")
        assert "unrecognized arguments" not in proc.stderr, command


def test_run_logs_config_warnings_in_the_log_format(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`run --log-format json` printed its config warnings as plain text among the JSON
    lines, which a log shipper reading JSON refuses."""
    monkeypatch.setattr(cli_module.web, "run_app", lambda *_, **__: None)
    config = good_config(tmp_path, free_port())
    config.write_text(config.read_text() + "[agents.vip]\n")  # a draft: one warning
    assert cli_module.main(["run", "--config", str(config), "--log-format", "json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line]
    assert any(e["msg"].startswith("config: agents.vip: draft") for e in lines), lines


def test_run_says_where_it_serves_as_a_json_line_where_logs_are_json(tmp_path: Path) -> None:
    """The plain "serving on" line on stdout broke the JSON that systemd and Docker collect;
    it stays on stdout, as a line like the log's."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "run", "--config", str(good_config(tmp_path, port))],
        cwd=ROOT,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        entry = json.loads(line)
        assert entry["msg"] == f"Switchboard serving on http://127.0.0.1:{port}/"
        assert entry["level"] == "info"
    finally:
        proc.terminate()
        proc.communicate(timeout=20)


def test_output_to_a_reader_that_went_away_is_no_traceback() -> None:
    """`switchboard check | head -1`, at its worst: the reader is gone before any write."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        piped = subprocess.run(
            [sys.executable, "-m", "gateway", "check", "--offline"],
            cwd=ROOT,
            env=clean_env(),
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=20,
            check=False,
        )
    finally:
        os.close(write_end)
    assert piped.returncode == 1
    assert piped.stderr == ""


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("SWITCHBOARD__AGENT__TIMEZONE", "Europe"),  # a folder of zones
        ("SWITCHBOARD__AGENT__TIMEZONE", "Z" * 300),
        ("SWITCHBOARD__AGENT__KNOWLEDGE_DIR", "k" * 300),
        ("SWITCHBOARD__AGENT__SKILLS_DIR", "s" * 300),
    ],
)
def test_values_the_file_system_refuses_are_problems_under_their_key(key: str, value: str) -> None:
    """These crashed check and run with IsADirectoryError or "File name too long" (exit 1)."""
    proc = cli("check", "--offline", env=clean_env(**{key: value}))
    assert proc.returncode == 2
    assert key.removeprefix("SWITCHBOARD__").lower().replace("__", ".") in proc.stderr
    assert_no_traceback(proc)


def test_a_log_level_or_format_that_does_not_exist_exits_2_naming_it() -> None:
    loud = cli("--log-level", "LOUD", "check", "--offline")
    xml = cli("check", "--offline", env=clean_env(SWITCHBOARD_LOG_FORMAT="xml"))
    for proc, named in ((loud, "SWITCHBOARD_LOG_LEVEL"), (xml, "SWITCHBOARD_LOG_FORMAT")):
        assert proc.returncode == 2
        assert named in proc.stderr
        assert_no_traceback(proc)


def test_ctrl_c_at_the_chat_prompt_ends_it_at_once(tmp_path: Path) -> None:
    """stdin stays open (nobody typed Enter): SIGINT must end the chat without waiting for a
    line, and nothing typed later is taken."""
    proc = chat_process(
        tmp_path,
        stdout=subprocess.DEVNULL,
        # as a terminal starts it: a suite run as a background job (`make test &`) ignores
        # SIGINT, and its children would inherit that and never hear the Ctrl+C
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 60  # a fresh checkout builds the knowledge index first
        while "runtime started" not in proc.stderr.readline():
            assert time.monotonic() < deadline
            assert proc.poll() is None
        time.sleep(0.5)  # and is reading stdin
        # stderr is read meanwhile, or the process could block on a full pipe as it logs its
        # way out (stdin stays open: its end would stop the chat too)
        err: list[str] = []
        reader = threading.Thread(target=lambda: err.extend(proc.stderr or ()), daemon=True)
        reader.start()
        proc.send_signal(signal.SIGINT)
        try:
            code: int | None = proc.wait(15)  # without a line typed
        except subprocess.TimeoutExpired:
            code = None
        assert code == 130, "".join(err)[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        for pipe in (proc.stdin, proc.stderr):
            if pipe is not None and not pipe.closed:
                pipe.close()


def test_chat_with_a_bad_config_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(BAD_TOML, encoding="utf-8")
    proc = cli("chat", "--config", str(bad), stdin="hello\n")
    assert proc.returncode == 2
    assert "agent.limits.max_steps" in proc.stderr
    assert_no_traceback(proc)


async def test_settling_the_heap_freezes_what_startup_built() -> None:
    before = gc.get_threshold()
    try:
        await settle_heap()
        assert gc.get_freeze_count() > 1000  # everything alive now is left out of collections
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, 10, 10)
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_run_settles_the_heap_once_everything_else_has_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: list[web.Application] = []
    monkeypatch.setattr(cli_module.web, "run_app", lambda app, **_: served.append(app))
    config = good_config(tmp_path, free_port())
    assert cli_module.main(["run", "--config", str(config)]) == 0
    (app,) = served
    assert list(app.on_startup)[-1] is settle_heap  # after the runtime and the channels


@pytest.mark.parametrize(
    ("database", "reason"),
    [
        ("no_such_database_here", 'database "no_such_database_here" does not exist'),
        ("test?search_path=no_such_schema", "no schema of the URL's search_path exists"),
    ],
)
def test_a_postgresql_store_that_cannot_be_opened_names_store_url(
    tmp_path: Path, database: str, reason: str
) -> None:
    """`run` exited 1 with "error: store: ..."; `check` called the same URL "config ok"."""
    config = tmp_path / "sb.toml"
    config.write_text(
        f'[server]\nport = {free_port()}\n[store]\nurl = "{PG_BASE.rsplit("/", 1)[0]}/{database}"\n'
    )
    run = cli("run", "--config", str(config), "--log-format", "text")
    assert run.returncode == 2
    assert "store.url" in run.stderr
    assert reason in run.stderr
    assert "Traceback" not in run.stderr
    check = cli("check", "--config", str(config))
    assert "store (PostgreSQL): FAILED" in check.stdout
    assert reason in check.stdout
    assert check.returncode == 2  # as run: it said "config ok" and exited 0
    assert "store.url" in check.stderr
    assert "config ok" not in check.stdout  # said, then "config error" and exit 2
