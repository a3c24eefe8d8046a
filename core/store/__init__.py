"""Durable state behind one Protocol; SQLite is the embedded default."""

from core.store.base import (
    HistoryEntry,
    InboxItem,
    InboxStatus,
    PutResult,
    Quota,
    RunRecord,
    SessionRecord,
    Store,
    TranscriptEntry,
)
from core.store.sqlite import SqliteStore

__all__ = [
    "HistoryEntry",
    "InboxItem",
    "InboxStatus",
    "PutResult",
    "Quota",
    "RunRecord",
    "SessionRecord",
    "SqliteStore",
    "Store",
    "TranscriptEntry",
]
