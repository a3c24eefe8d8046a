"""Socket Mode end to end: apps.connections.open on the fake Web API, envelopes over the fake
websocket, each acknowledged once stored, then answered through the Web API like webhook
events."""

from __future__ import annotations

import asyncio
import copy
import logging
from pathlib import Path

import pytest
from aiohttp import web

from tests.fake_openai import FakeOpenAI, last_user_text
from tests.fake_slack import APP_TOKEN, FakeSlack, gateway_config, payload, run_gateway
from tests.fakes import failing_puts


async def test_socket_mode_acks_envelopes_and_answers_through_the_web_api(
    tmp_path: Path, fake_openai: FakeOpenAI
) -> None:
    slack = FakeSlack()
    await slack.start()
    try:
        config = gateway_config(tmp_path, slack, fake_openai.url, 'mode = "socket"\n')
        async with run_gateway(config):
            envelope = payload("socket_events_api")
            await slack.push(envelope)
            (reply,) = await slack.wait_for(lambda: slack.posted("D0DM000001"))
            assert reply["text"] == "echo: hello over the socket"
            assert envelope["envelope_id"] in slack.acks

            redelivery = copy.deepcopy(envelope)
            redelivery.update(envelope_id="second-envelope", retry_attempt=1)
            await slack.push(redelivery)
            await slack.wait_for(lambda: "second-envelope" in slack.acks)

            click = payload("block_actions")
            click["channel"]["id"] = click["container"]["channel_id"] = "D0DM000001"
            await slack.push(
                {
                    "envelope_id": "click-1",
                    "type": "interactive",
                    "payload": click,
                    "retry_attempt": 0,
                }
            )
            await slack.wait_for(lambda: len(slack.posted("D0DM000001")) == 2)
            assert "click-1" in slack.acks
    finally:
        await slack.aclose()
    opened = [c for c in slack.calls if c.method == "apps.connections.open"]
    assert len(opened) == 1
    assert len(fake_openai.requests) == 2  # the redelivered envelope started nothing
    assert "pressed the button: Yes, book it" in last_user_text(fake_openai.requests[1])


async def test_an_envelope_not_stored_is_not_acknowledged_and_its_retry_is_answered(
    tmp_path: Path, fake_openai: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    slack = FakeSlack()
    await slack.start()
    try:
        config = gateway_config(tmp_path, slack, fake_openai.url, 'mode = "socket"\n')
        async with run_gateway(config) as gw:
            failing_puts(monkeypatch, gw.store, 1, "database or disk is full")
            envelope = payload("socket_events_api")
            await slack.push(envelope)
            await asyncio.sleep(0.5)
            assert envelope["envelope_id"] not in slack.acks  # Slack will send it again
            assert slack.posted("D0DM000001") == []

            retry = copy.deepcopy(envelope)
            retry.update(envelope_id="retry-envelope", retry_attempt=1)
            await slack.push(retry)
            (reply,) = await slack.wait_for(lambda: slack.posted("D0DM000001"))
            assert reply["text"] == "echo: hello over the socket"
            assert "retry-envelope" in slack.acks
    finally:
        await slack.aclose()


class FlappingSlack(FakeSlack):
    """Accepts each websocket, then at once closes it, or says `disconnect` and closes it."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how

    async def _socket(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        if self.how == "disconnect":
            await ws.send_json({"type": "disconnect", "reason": "too_many_websockets"})
            await asyncio.sleep(0.05)
        await ws.close()
        return ws


def _opened(slack: FakeSlack) -> int:
    return sum(1 for c in slack.calls if c.method == "apps.connections.open")


@pytest.mark.parametrize("how", ["close", "disconnect"])
async def test_a_slack_that_drops_every_connection_is_retried_with_a_backoff(
    tmp_path: Path, fake_openai: FakeOpenAI, how: str
) -> None:
    """The SDK asked for a new connection at once each time: 550-680 apps.connections.open
    calls a second (a Tier 1 method), half a core, and a log line each."""
    slack = FlappingSlack(how)
    await slack.start()
    try:
        config = gateway_config(tmp_path, slack, fake_openai.url, 'mode = "socket"\n')
        async with run_gateway(config):
            await asyncio.sleep(2.5)  # at 0 s, then after waits of 1 s and 2 s
            assert 2 <= _opened(slack) <= 4
    finally:
        await slack.aclose()


async def test_an_app_token_slack_refuses_is_said_once_naming_the_key(
    tmp_path: Path, fake_openai: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    """invalid_auth was retried every 5 s forever, with an ERROR and a traceback each time
    and nothing naming channels.slack.app_token."""
    slack = FakeSlack()
    await slack.start()
    try:
        config = gateway_config(tmp_path, slack, fake_openai.url, 'mode = "socket"\n')
        config.write_text(config.read_text().replace(APP_TOKEN, "xapp-1-refused"))
        with caplog.at_level(logging.INFO, logger="channels.slack.socket"):
            async with run_gateway(config):
                await asyncio.sleep(2.5)
    finally:
        await slack.aclose()
    assert 2 <= _opened(slack) <= 4
    mine = [r for r in caplog.records if r.name == "channels.slack.socket"]
    errors = [r.getMessage() for r in mine if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert errors[0].startswith("channels.slack.app_token: Slack refused it (invalid_auth)")
    assert all(r.exc_info is None for r in mine)
