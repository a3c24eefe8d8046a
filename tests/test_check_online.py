"""`switchboard check` tries each enabled channel's credentials and the model endpoint, and
prints the webhook URLs to configure."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from gateway.probes import probe_all, webhook_urls
from gateway.settings import load_settings
from tests.conftest import ROOT
from tests.fake_openai import FakeOpenAI
from tests.fake_slack import APP_TOKEN, BOT_TOKEN, FakeSlack
from tests.fake_telegram import TOKEN, FakeTelegram
from tests.fake_whatsapp import FakeGraph


class Fakes:
    def __init__(self, model: FakeOpenAI) -> None:
        self.telegram, self.slack, self.graph = FakeTelegram(), FakeSlack(), FakeGraph()
        self.model = model


@pytest_asyncio.fixture
async def fakes(fake_openai: FakeOpenAI) -> AsyncIterator[Fakes]:
    fake_openai.api_key = "sk-good"
    f = Fakes(fake_openai)
    for fake in (f.telegram, f.slack, f.graph):
        await fake.start()
    yield f
    for fake in (f.telegram, f.slack, f.graph):
        await fake.aclose()


def _config(tmp_path: Path, f: Fakes, *, tg_token: str = TOKEN, key: str = "sk-good") -> Path:
    path = tmp_path / "sb.toml"
    path.write_text(
        '[server]\npublic_url = "https://bot.example.com"\n'
        f'[model]\nprovider = "openai"\nbase_url = "{f.model.url}"\nname = "fake"\n'
        f'api_key = "{key}"\n'
        f'[channels.telegram]\nenabled = true\ntoken = "{tg_token}"\n'
        f'webhook_secret = "s3cret"\napi_base = "{f.telegram.url}"\n'
        f'[channels.slack]\nenabled = true\nbot_token = "{BOT_TOKEN}"\nsigning_secret = "x"\n'
        f'api_base = "{f.slack.api_base}"\n'
        f'[channels.whatsapp]\nenabled = true\naccess_token = "wa-token"\napp_secret = "a"\n'
        f'verify_token = "v"\nphone_number_id = "1001"\napi_base = "{f.graph.url}"\n'
    )
    return path


async def test_every_credential_and_the_model_are_tried(tmp_path: Path, fakes: Fakes) -> None:
    settings = load_settings(_config(tmp_path, fakes))
    probes = {p.name: p for p in await probe_all(settings)}
    assert all(p.ok for p in probes.values()), probes
    assert probes["telegram getMe"].detail.startswith("@")
    assert probes["whatsapp phone number"].detail == "+1 555 000 1001"
    assert "fake listed" in probes["model of default (openai)"].detail
    assert [p for p, _ in webhook_urls(settings)] == ["telegram", "slack", "whatsapp"]
    assert webhook_urls(settings)[2][1].startswith("https://bot.example.com/webhooks/whatsapp")


async def test_bad_credentials_fail_their_check(tmp_path: Path, fakes: Fakes) -> None:
    settings = load_settings(_config(tmp_path, fakes, tg_token="999:not-the-bot", key="sk-wrong"))
    probes = {p.name: p for p in await probe_all(settings)}
    assert not probes["telegram getMe"].ok
    assert "(check channels.telegram.token)" in probes["telegram getMe"].detail
    assert not probes["model of default (openai)"].ok
    assert "refused the key" in probes["model of default (openai)"].detail
    # each failure names the keys to look at, the model's too (it named none)
    keys = "(check model.base_url, model.api_key, model.name)"
    assert probes["model of default (openai)"].detail.endswith(keys)
    assert probes["slack auth.test"].ok


async def test_a_platform_never_reached_names_its_address_not_its_token(
    tmp_path: Path, fakes: Fakes
) -> None:
    """Nothing listening at api_base: the report said to check the token."""
    path = _config(tmp_path, fakes)
    for fake in (fakes.telegram.url, fakes.slack.api_base, fakes.graph.url):
        path.write_text(path.read_text().replace(fake, "http://127.0.0.1:9"))
    probes = {p.name: p for p in await probe_all(load_settings(path))}
    for name, channel in (
        ("telegram getMe", "telegram"),
        ("slack auth.test", "slack"),
        ("whatsapp phone number", "whatsapp"),
    ):
        assert probes[name].detail.endswith(f"(check channels.{channel}.api_base)"), probes[name]


async def test_a_slack_api_base_answering_no_json_names_the_address(
    tmp_path: Path, fakes: Fakes
) -> None:
    """A proxy's page where Slack's JSON should be: the report was an AttributeError that said
    to check the bot token."""
    fakes.slack.fail("auth.test", 502, retry_after=None, body="<html>Bad gateway</html>")
    probes = {p.name: p for p in await probe_all(load_settings(_config(tmp_path, fakes)))}
    detail = probes["slack auth.test"].detail
    assert "HTTP 502 with a body that is not JSON" in detail
    assert detail.endswith("(check channels.slack.api_base)")


async def test_check_reports_failed_live_checks_and_fails_only_when_strict(
    tmp_path: Path, fakes: Fakes
) -> None:
    config = _config(tmp_path, fakes, key="sk-wrong")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD__")}

    def check(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gateway", "check", "--config", str(config), *extra],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    reported = await asyncio.to_thread(check)
    assert reported.returncode == 0, reported.stdout + reported.stderr
    assert "FAILED" in reported.stdout
    failed = await asyncio.to_thread(check, "--strict")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "https://bot.example.com/webhooks/telegram" in failed.stdout
    assert "sk-wrong" not in failed.stdout + failed.stderr
    offline = await asyncio.to_thread(check, "--offline")
    assert offline.returncode == 0
    assert "live checks" not in offline.stdout


async def test_socket_modes_app_token_is_tried_too(tmp_path: Path, fakes: Fakes) -> None:
    """Only auth.test (the bot token) was tried: a refused app token passed check --strict,
    and Socket Mode then never connected."""
    path = _config(tmp_path, fakes)
    text = path.read_text().replace(
        'signing_secret = "x"\n', 'signing_secret = "x"\nmode = "socket"\napp_token = "{}"\n'
    )
    for token, ok in ((APP_TOKEN, True), ("xapp-1-refused", False)):
        path.write_text(text.replace("{}", token))
        probes = {p.name: p for p in await probe_all(load_settings(path))}
        probe = probes["slack app_token (Socket Mode)"]
        assert probe.ok is ok, probe
        assert probes["slack auth.test"].ok
    assert "invalid_auth" in probe.detail


async def test_a_library_refusing_a_value_is_a_failed_check_not_a_traceback() -> None:
    """httpx raised ValueError for a header holding a line break: `check` printed a
    traceback where it promises a report."""
    from gateway.probes import _run

    async def refuses() -> str:
        raise ValueError("Forbidden control character detected in headers")

    probe = await _run("whatsapp phone number", refuses)
    assert not probe.ok
    assert probe.detail == "ValueError: Forbidden control character detected in headers"
