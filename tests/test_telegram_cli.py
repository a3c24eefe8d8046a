"""`switchboard telegram set-webhook` as a real process against the fake Bot API."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from gateway.cli import _telegram_set_webhook, main
from gateway.settings import load_settings
from tests.fake_telegram import SECRET, FakeTelegram, running_fake

ROOT = Path(__file__).resolve().parent.parent


@pytest_asyncio.fixture
async def tg(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeTelegram]:
    async with running_fake(monkeypatch) as fake:
        yield fake


def config(tmp_path: Path, name: str, tg: FakeTelegram, server: str, telegram: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f"[server]\n{server}\n"
        f'[channels.telegram]\nenabled = true\ntoken = "{tg.token}"\n'
        f'api_base = "{tg.url}"\n{telegram}\n',
        encoding="utf-8",
    )
    return path


async def cli(*args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD__")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        *args,
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_set_webhook_registers_the_public_url_with_secret_and_updates(
    tmp_path: Path, tg: FakeTelegram
) -> None:
    good = config(
        tmp_path,
        "good",
        tg,
        'public_url = "https://bot.example.com/"',
        f'webhook_secret = "{SECRET}"\nallowed_updates = ["message", "callback_query"]',
    )
    no_url = config(tmp_path, "no_url", tg, "", f'mode = "webhook"\nwebhook_secret = "{SECRET}"')
    ok, missing = await asyncio.gather(
        cli("telegram", "set-webhook", "--config", str(good)),
        cli("telegram", "set-webhook", "--config", str(no_url)),
    )
    code, out, err = ok
    assert code == 0, err
    assert "webhook set: https://bot.example.com/webhooks/telegram" in out
    assert "message, callback_query" in out
    assert tg.webhook == {
        "url": "https://bot.example.com/webhooks/telegram",
        "secret_token": SECRET,
        "allowed_updates": ["message", "callback_query"],
    }
    code, out, err = missing
    assert code == 2
    assert "server.public_url" in err
    assert "Traceback" not in err
    for _, out, err in (ok, missing):
        assert tg.token not in out + err
        assert SECRET not in out + err


async def test_set_webhook_names_the_keys_it_lacks_and_reports_refusals(
    tmp_path: Path, tg: FakeTelegram, capsys: pytest.CaptureFixture[str]
) -> None:
    polling = config(
        tmp_path, "polling", tg, 'public_url = "https://b.example.com"', 'mode = "polling"'
    )
    plain_http = config(
        tmp_path,
        "http",
        tg,
        'public_url = "http://bot.example.com"',
        f'webhook_secret = "{SECRET}"',
    )
    assert await _telegram_set_webhook(load_settings(polling), str(polling)) == 2
    err = capsys.readouterr().err
    assert "channels.telegram.mode" in err
    assert "channels.telegram.webhook_secret" in err
    assert await _telegram_set_webhook(load_settings(plain_http), str(plain_http)) == 1
    err = capsys.readouterr().err
    assert "https url must be provided" in err.lower()
    assert tg.token not in err
    assert tg.webhook is None


def test_telegram_needs_a_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["telegram"])
    assert exc.value.code == 2
    assert "set-webhook" in capsys.readouterr().err
