"""Retention: what is older than the configured days is deleted, in the store and on disk.

In the store (Store.prune): answered messages, history, sent and failed reply parts, run
records, earlier days' usage counters, channel state not written since (but the namespaces
kept for good, such as approved senders), and the sessions left with nothing. Work is never
deleted: a pending, held or unpaired message, an undelivered reply, a running run. On disk:
the files in the session folders (media people sent, tool results, skill files) not changed
since, and the folders left empty.

Deletes go in small batches, so the store keeps taking webhooks meanwhile. Every replica may
sweep: deleting what another replica already deleted deletes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

from core.periodic import every
from core.store.base import Store

__all__ = ["Retention"]

log = logging.getLogger(__name__)

FIRST_SWEEP_S = 60.0  # after start: a restart is not slowed by a sweep
EVERY_S = 3600.0
BATCH = 1000  # rows per table per store call
PAUSE_S = 0.05  # between batches: other writes go first


class Retention:
    def __init__(
        self,
        store: Store,
        days: float,
        *,
        folders: Sequence[Path] = (),
        keep_namespaces: Sequence[str] = (),
    ) -> None:
        self._store = store
        self._keep_s = days * 86400
        self._folders = list(dict.fromkeys(folders))
        self._keep_namespaces = list(keep_namespaces)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        # must outlive any one failure
        sweep = every(EVERY_S, self.sweep, "retention sweep", first_after_s=FIRST_SWEEP_S)
        self._task = asyncio.create_task(sweep)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def sweep(self, now: float | None = None) -> dict[str, int]:
        """Delete what is over; returns how many rows per table and "files"."""
        before = (time.time() if now is None else now) - self._keep_s
        total: dict[str, int] = {}
        while True:
            deleted = await self._store.prune(
                before, keep_namespaces=self._keep_namespaces, limit=BATCH
            )
            for table, n in deleted.items():
                total[table] = total.get(table, 0) + n
            if max(deleted.values(), default=0) < BATCH:
                break
            await asyncio.sleep(PAUSE_S)
        total["files"] = await asyncio.to_thread(_delete_files, self._folders, before)
        if any(total.values()):
            shown = ", ".join(f"{n} {what}" for what, n in total.items() if n)
            log.info(
                "retention: deleted what was over %g days ago: %s", self._keep_s / 86400, shown
            )
        return total


def _delete_files(folders: list[Path], before: float) -> int:
    """Files not changed since `before` under each folder, then the folders left empty (the
    roots stay). A file that goes or cannot be deleted meanwhile is left to the next sweep."""
    deleted = 0
    for root in folders:
        if not root.is_dir():
            continue
        # folders' times before anything is deleted (deleting in one changes its time): one
        # made or changed since `before` (a run's new folder) is never removed
        stale = {w for w, _, _ in os.walk(root) if _changed_before(Path(w), before)}
        for where, _dirs, files in os.walk(root, topdown=False):
            folder = Path(where)
            for name in files:
                path = folder / name
                with contextlib.suppress(OSError):
                    if path.lstat().st_mtime < before:
                        path.unlink()
                        deleted += 1
            if folder != root and where in stale:
                with contextlib.suppress(OSError):  # not empty, or gone: fine
                    folder.rmdir()
    return deleted


def _changed_before(path: Path, before: float) -> bool:
    try:
        return path.stat().st_mtime < before
    except OSError:
        return False
