"""Metrics on /metrics and structured logs."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import httpx

from gateway.app import build_app
from gateway.logs import _JsonFormatter
from gateway.settings import load_settings
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
