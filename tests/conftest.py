"""Shared fixtures. Tests never touch the network: fakes listen on 127.0.0.1 only."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from core.store import SqliteStore, Store
from tests.fake_openai import FakeOpenAI

ROOT = Path(__file__).resolve().parent.parent
# python-telegram-bot 22 warns (an error here) unless its retry_after is a timedelta
os.environ.setdefault("PTB_TIMEDELTA", "true")


@pytest.fixture(autouse=True)
def _in_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """Relative paths in the shipped config (config/knowledge) resolve from the repo root."""
    monkeypatch.chdir(ROOT)
    for name in list(os.environ):
        if name.startswith("SWITCHBOARD__"):
            monkeypatch.delenv(name)


@pytest_asyncio.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """A started store of each kind: what runs on one must run on the other."""
    async with contextlib.AsyncExitStack() as stack:
        if request.param == "postgres":
            from core.store.postgres import PostgresStore

            s: Store = PostgresStore(await stack.enter_async_context(pg_schema()))
        else:
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


PG_BASE = os.environ.get("SWITCHBOARD_TEST_POSTGRES", "postgresql://postgres@127.0.0.1/test")


@contextlib.asynccontextmanager
async def pg_schema() -> AsyncIterator[str]:
    """A PostgreSQL URL whose search_path is a fresh schema, dropped afterwards. Needs the
    server that .ci/run starts; tests using it are never skipped."""
    import asyncpg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(PG_BASE)
    try:
        await admin.execute(f"CREATE SCHEMA {schema}")
        yield f"{PG_BASE}?search_path={schema}"
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await admin.close()


@pytest_asyncio.fixture
async def pg_url() -> AsyncIterator[str]:
    async with pg_schema() as url:
        yield url
