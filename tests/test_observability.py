"""Metrics on /metrics and structured logs."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest

from channels.base import LINGER_S
from core.agent.loop import AgentLoop, Limits
from core.agent.tools import ToolRegistry
from core.models import InboundMessage, Sender
from core.sessions import AgentProfile, DeliveryPolicy, SessionManager
from core.store import Store
from gateway.app import build_app
from gateway.logs import PARSER_REFUSALS, _Context, _JsonFormatter, _OutOfFiles, _WebSessionIds
from gateway.settings import load_settings
from tests.fakes import RecordingOutlet, ScriptedModel, text
from tests.loopback import serve


async def test_metrics_count_inbound_runs_sends_and_http(tmp_path: Path) -> None:
    config = tmp_path / "sb.toml"
    config.write_text(
        f'[server]\nmax_body_bytes = 2048\n[store]\nurl = "sqlite:///{tmp_path}/db"\n'
    )
    runner, url = await serve(build_app(load_settings(config)))
    try:
        async with httpx.AsyncClient(base_url=url, timeout=10) as c:
            await c.get("/")
            body = {"text": "what are your opening hours?", "client_id": "m1"}
            assert (await c.post("/chat/messages", json=body)).status_code == 202
            assert (await c.post("/chat/messages", json=body)).status_code == 202  # duplicate
            assert (await c.post("/chat/messages", content=b"x" * 4000)).status_code == 413
            async with asyncio.timeout(10):
                while True:
                    text = (await c.get("/metrics")).text
                    if 'switchboard_sends_total{channel="web",outcome="sent"} 1.0' in text:
                        break
                    await asyncio.sleep(0.05)
    finally:
        await runner.cleanup()
    assert 'switchboard_inbound_messages_total{channel="web",outcome="pending"} 1.0' in text
    assert 'switchboard_inbound_messages_total{channel="web",outcome="duplicate"} 1.0' in text
    assert 'switchboard_runs_total{agent="default",channel="web",status="ok"} 1.0' in text
    assert 'switchboard_http_responses_total{route="/chat/messages",status="413"} 1.0' in text
    assert "switchboard_model_call_seconds_count 2.0" in text  # search, then answer
    assert 'switchboard_tokens_total{direction="output"}' in text
    assert "switchboard_active_sessions" in text
    assert "switchboard_queue_depth 0.0" in text  # sampled at start: nothing was waiting


def test_json_log_lines_carry_the_session_and_run() -> None:
    record = logging.LogRecord(
        "core.sessions", logging.INFO, __file__, 1, "run %s ok", ("r1",), None
    )
    record.session = "default:web:default:abc"
    record.run_id = "r1"
    entry = json.loads(_JsonFormatter().format(record))
    assert entry["msg"] == "run r1 ok"
    assert entry["session"] == "default:web:default:abc"
    assert entry["run_id"] == "r1"
    assert entry["level"] == "info"


async def test_a_request_the_http_parser_refuses_is_one_warning_line(tmp_path: Path) -> None:
    """aiohttp answers an unparseable request with 400 itself (and a body it cannot decode
    with our 400) and logs it at ERROR with a traceback; anyone can send those, so the log
    gets one warning line with the reason."""
    config = tmp_path / "sb.toml"
    config.write_text(f'[store]\nurl = "sqlite:///{tmp_path}/db"\n')
    records: list[logging.LogRecord] = []
    collect = logging.Handler()
    collect.emit = records.append  # type: ignore[method-assign,assignment]
    server_log = logging.getLogger("aiohttp.server")
    server_log.addHandler(collect)
    server_log.addFilter(PARSER_REFUSALS)
    runner, url = await serve(build_app(load_settings(config)))
    host, port = url.removeprefix("http://").rstrip("/").split(":")
    try:
        for raw in (
            b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
            b"POST /webhooks/telegram HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
            b"POST /chat/messages HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\n"
            b"Content-Type: application/json\r\nContent-Length: 7\r\nConnection: close\r\n"
            b'\r\n{"a":1}',
        ):
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(raw)
            answer = await reader.read()
            writer.close()
            assert answer.split(b" ", 2)[1] == b"400", answer[:80]
    finally:
        await runner.cleanup()
        server_log.removeHandler(collect)
        server_log.removeFilter(PARSER_REFUSALS)
    assert [(r.levelname, r.exc_info) for r in records] == [("WARNING", None)] * 3
    lines = [r.getMessage() for r in records]
    assert "Can not decode content-encoding: gzip" in lines[2]
    assert "400 Got more than 8190 bytes" in lines[0]
    assert len(lines[0]) < 300
    assert "400 Invalid character in Content-Length" in lines[1]
    assert "\n" not in lines[1]


class _DeepModel(ScriptedModel):
    """Logs from inside the model call, as a retry or a client library does: code that
    does not know which conversation it serves."""

    async def complete(self, request: Any, on_delta: Any = None) -> Any:
        logging.getLogger("tests.deep").warning("deep inside the call")
        return await super().complete(request, on_delta)


async def test_lines_logged_deep_in_a_run_carry_its_session_channel_and_run(
    store: Store,
) -> None:
    """A model retry's line ("model call failed ...; retry 1") carried no session, channel or
    run_id, though the deployment guide says lines about a conversation do."""
    records: list[logging.LogRecord] = []
    collect = logging.Handler()
    collect.emit = records.append  # type: ignore[method-assign,assignment]
    collect.addFilter(_Context())
    deep = logging.getLogger("tests.deep")
    deep.addHandler(collect)
    model = _DeepModel()
    model.add(text("hello"))
    manager = SessionManager(
        store,
        {"default": AgentProfile("default", "x", AgentLoop(model, ToolRegistry(), Limits()))},
        {"test": RecordingOutlet()},
        delivery=DeliveryPolicy(base_delay_s=0.01),
    )
    await manager.start()
    try:
        msg = InboundMessage(
            channel="test", conversation="c9", sender=Sender(id="u"), text="hi", platform_id="1"
        )
        await manager.submit(msg)
        await asyncio.wait_for(manager.wait_idle(), 10)
    finally:
        deep.removeHandler(collect)
        await manager.aclose(grace_s=1)
    [line] = records
    assert getattr(line, "session", None) == "default:test:default:c9"
    assert getattr(line, "channel", None) == "test"
    assert len(getattr(line, "run_id", "")) == 32
    entry = json.loads(_JsonFormatter().format(line))
    assert entry["session"] == "default:test:default:c9"


def test_a_malformed_log_call_never_raises_into_its_caller() -> None:
    """The filter that shortens web chat ids formats each line: a call with a wrong number of
    arguments raised TypeError at the call, where logging itself only reports it."""
    logger = logging.getLogger("tests.malformed")
    handler = logging.Handler()
    handler.emit = lambda record: None  # type: ignore[method-assign,assignment]
    handler.addFilter(_WebSessionIds())
    logger.addHandler(handler)
    logger.propagate = False  # pytest's own handler raises on such a call
    try:
        logger.warning("two args %s %s", "one")
    finally:
        logger.removeHandler(handler)
        logger.propagate = True


@pytest.mark.parametrize(
    ("path", "content_type"),
    [
        ("/chat/messages", "application/json"),
        ("/webhooks/whatsapp", "application/json"),
        ("/webhooks/telegram", "application/json"),
        ("/webhooks/slack", "application/json"),
        ("/admin/login", "multipart/form-data; boundary=x"),
    ],
)
async def test_a_body_sent_too_slowly_gets_408_and_the_connection_closes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str, content_type: str
) -> None:
    """A client that sent its headers and then one byte of its body held the connection
    forever: some thousands of them used up the gateway's file descriptors and it stopped
    answering anyone."""
    monkeypatch.setattr("channels.base.BODY_WITHIN_S", 0.3)
    monkeypatch.setattr("gateway.http.BODY_WITHIN_S", 0.3)
    config = tmp_path / "sb.toml"
    config.write_text(
        f'[server]\npublic_url = "https://bot.example.com"\n'
        f'[store]\nurl = "sqlite:///{tmp_path}/db"\n[admin]\ntoken = "{"t" * 24}"\n'
        '[channels.whatsapp]\nenabled = true\naccess_token = "a"\napp_secret = "s"\n'
        'verify_token = "v"\nphone_number_id = "1"\napi_base = "http://127.0.0.1:9"\n'
        '[channels.telegram]\nenabled = true\ntoken = "1:x"\nwebhook_secret = "w"\n'
        'mode = "webhook"\napi_base = "http://127.0.0.1:9"\n'
        '[channels.slack]\nenabled = true\nbot_token = "xoxb-1"\nsigning_secret = "s"\n'
        'api_base = "http://127.0.0.1:9"\n'
    )
    runner, url = await serve(
        build_app(load_settings(config)), shutdown_timeout=0.5, lingering_time=LINGER_S
    )
    host, port = url.removeprefix("http://").rstrip("/").split(":")
    try:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\n"
            "X-Telegram-Bot-Api-Secret-Token: w\r\nContent-Length: 100\r\n\r\n{".encode()
        )
        await writer.drain()
        answer = b""
        async with asyncio.timeout(5):  # the 408, then the end: the server closes
            while chunk := await reader.read(4096):
                answer += chunk
        writer.close()
    finally:
        await runner.cleanup()
    assert answer.split(b" ", 2)[1] == b"408", answer[:200]
    assert b"not received within" in answer


def test_running_out_of_file_descriptors_is_one_line_a_minute() -> None:
    out_of_files = _OutOfFiles()
    lines = 0
    for _ in range(1000):
        record = logging.LogRecord(
            "asyncio",
            logging.ERROR,
            __file__,
            1,
            "socket.accept() out of system resource\nsocket: <x>",
            None,
            (OSError, OSError(24, "Too many open files"), None),
        )
        if out_of_files.filter(record):
            lines += 1
            assert record.exc_info is None
            assert "out of file descriptors" in record.getMessage()
    assert lines == 1


def test_failures_libraries_log_and_raise_to_us_are_not_logged_twice() -> None:
    """A Bot API error page logged a traceback per attempt; the PostgreSQL pool, one a minute
    through an outage. Our code logs each failure once."""
    from gateway.logs import setup_logging

    root = logging.getLogger()
    kept = root.handlers[:], root.level
    try:
        setup_logging("INFO")
        assert not logging.getLogger("telegram.request").isEnabledFor(logging.ERROR)
        assert not logging.getLogger("asyncpg.pool").isEnabledFor(logging.WARNING)
        assert logging.getLogger("asyncpg.pool").isEnabledFor(logging.ERROR)
        assert logging.getLogger("core.outbox").isEnabledFor(logging.INFO)
    finally:
        root.handlers[:], level = kept
        root.setLevel(level)
        for name in ("telegram.request", "asyncpg.pool"):
            logging.getLogger(name).setLevel(logging.NOTSET)
