"""The real gateway CLI (`python -m gateway`) with session runs switched off: every webhook is
verified, parsed, deduped and stored exactly as in production, and nothing answers it. The
ingest benchmark serves this so agent work does not share the gateway's core with the routes
it measures (the end-to-end benchmark measures the whole path on the unmodified CLI).

`SWITCHBOARD_BENCH_STOP_BEFORE` cuts the route short, to show what each stage costs (ingest's
stage rows; never a result of the real route):
- `submit`: the channel's work only (signature, parsing, normalizing, the session key); the
  session manager's submit answers "stored" at once.
- `store`: everything up to the inbox write (access control, telemetry, the payload as JSON);
  the store's put_inbound answers "stored" without writing.
"""

from __future__ import annotations

import os
import sys

from bench.gateway import STAGES, STOP_BEFORE
from core.models import InboundMessage, SessionKey
from core.sessions import SessionManager
from core.store import InboxStatus, PutResult
from core.store.postgres import PostgresStore
from core.store.sqlite import SqliteStore
from gateway.cli import main


def _no_wake(self: SessionManager, key: SessionKey, *, arrived: bool) -> None:
    return None


async def _not_submitted(
    self: SessionManager, msg: InboundMessage, key: SessionKey | None = None
) -> PutResult:
    return PutResult(0, InboxStatus.PENDING)


async def _not_written(
    self: object, session: str, msg: InboundMessage, max_pending: int, *, unpaired: bool = False
) -> PutResult:
    msg.model_dump_json()  # what the real put_inbound does before its write
    return PutResult(0, InboxStatus.PENDING)


def _cut(stage: str) -> None:
    if stage == "submit":
        SessionManager.submit = _not_submitted  # type: ignore[method-assign]
    elif stage == "store":
        SqliteStore.put_inbound = _not_written  # type: ignore[method-assign]
        PostgresStore.put_inbound = _not_written  # type: ignore[method-assign]
    elif stage:
        sys.exit(f"{STOP_BEFORE}: {stage!r} is not one of {', '.join(STAGES)}")


SessionManager._wake = _no_wake  # type: ignore[method-assign]

if __name__ == "__main__":
    _cut(os.environ.get(STOP_BEFORE, ""))
    sys.exit(main())
