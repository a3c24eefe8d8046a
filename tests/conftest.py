"""Shared fixtures. Tests never touch the network: fakes listen on 127.0.0.1 only."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from core.store import SqliteStore
from tests.fake_openai import FakeOpenAI

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _in_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """Relative paths in the shipped config (config/knowledge) resolve from the repo root."""
    monkeypatch.chdir(ROOT)
    for name in list(__import__("os").environ):
        if name.startswith("SWITCHBOARD__"):
            monkeypatch.delenv(name)


@pytest_asyncio.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(tmp_path / "test.db")
    await s.start()
    yield s
    await s.aclose()


@pytest_asyncio.fixture
async def fake_openai() -> AsyncIterator[FakeOpenAI]:
    fake = FakeOpenAI()
    await fake.start()
    yield fake
    await fake.aclose()
