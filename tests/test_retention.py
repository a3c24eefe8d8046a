"""Retention: the store's rows (the contract test is test_store.py's prune test) and the
session folders' files older than store.retention_days go; work and recent things stay."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from core.errors import ConfigError
from core.models import InboundMessage, Reply, Sender
from core.retention import Retention
from core.store import Store
from gateway.runtime import KEPT_NAMESPACES, Runtime
from gateway.settings import load_settings

DAY = 86400.0


def _old(path: Path, days: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.write_text("x")
    then = time.time() - days * DAY
    os.utime(path, (then, then))
    return path


async def test_a_sweep_deletes_old_rows_and_files_and_keeps_the_rest(
    store: Store, tmp_path: Path
) -> None:
    media, workspace = tmp_path / "files", tmp_path / "workspace"
    old_photo = _old(media / "web_alice" / "photo.jpg", 40)
    new_photo = _old(media / "web_bob" / "photo.jpg", 1)
    old_result = _old(workspace / "web_alice" / "results" / "r1.json", 40)
    for folder in (old_photo.parent, old_result.parent, old_result.parent.parent):
        _old(folder, 40)  # a folder's time changes with its files: set it last
    session = "default:web:default:alice"
    msg = InboundMessage(
        channel="web", conversation="alice", sender=Sender(id="alice"), text="hi", platform_id="1"
    )
    put = await store.put_inbound(session, msg, 100)
    assert await store.acquire_lease(session, "w", 30)
    from tests.test_store import run_for

    await store.complete_turn("w", run_for(session, [put.id]), "hi", [Reply(text="hello")])
    await store.release_lease(session, "w")
    await store.kv_set(KEPT_NAMESPACES[0], "web:alice", "approved")

    retention = Retention(
        store, 30, folders=[media, workspace, tmp_path / "missing"], keep_namespaces=KEPT_NAMESPACES
    )
    assert (await retention.sweep())["files"] == 2  # the rows are newer than 30 days
    assert not old_photo.exists()
    assert not old_result.exists()
    assert not old_photo.parent.exists()  # emptied: gone
    assert not (workspace / "web_alice").exists()
    assert new_photo.exists()
    assert media.is_dir()  # the roots stay
    assert workspace.is_dir()
    assert await store.history(session, 10) != []

    later = await retention.sweep(now=time.time() + 31 * DAY)
    assert later["messages"] == 2
    assert later["inbox"] == 1
    assert await store.history(session, 10) == []
    assert await store.kv_get(KEPT_NAMESPACES[0], "web:alice") == "approved"


@pytest.mark.parametrize(("days", "ok"), [(0, True), (7, True), (365, True), (1, False)])
def test_retention_is_off_or_a_week_at_least(tmp_path: Path, days: float, ok: bool) -> None:
    """WhatsApp redelivers for up to 7 days: a message deleted before would be answered again."""
    path = tmp_path / "switchboard.toml"
    path.write_text(f"[store]\nretention_days = {days}\n")
    if ok:
        assert load_settings(path).store.retention_days == days
        return
    with pytest.raises(ConfigError) as err:
        load_settings(path)
    [(key, reason)] = err.value.problems
    assert key == "store.retention_days"
    assert "at least 7 days" in reason


def test_the_runtime_sweeps_the_session_folders_only_when_asked(tmp_path: Path) -> None:
    path = tmp_path / "switchboard.toml"
    body = (
        f'[store]\nurl = "sqlite:///{tmp_path}/s.db"\n'
        f'[channels]\nmedia_dir = "{tmp_path}/files"\n'
        f'[agent]\nworkspace_dir = "{tmp_path}/ws"\nknowledge_cache = "{tmp_path}/i.json"\n'
    )
    path.write_text(body)
    assert Runtime.build(load_settings(path), {}).retention is None
    path.write_text(body.replace("[store]\n", "[store]\nretention_days = 90\n"))
    retention = Runtime.build(load_settings(path), {}).retention
    assert retention is not None
    assert retention._folders == [tmp_path / "files", tmp_path / "ws"]
