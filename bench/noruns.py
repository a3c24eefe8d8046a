"""The real gateway CLI (`python -m gateway`) with session runs switched off: every webhook is
verified, parsed, deduped and stored exactly as in production, and nothing answers it. The
ingest benchmark serves this so agent work does not share the gateway's core with the routes
it measures (the end-to-end benchmark measures the whole path on the unmodified CLI)."""

from __future__ import annotations

import sys

from core.models import SessionKey
from core.sessions import SessionManager
from gateway.cli import main


def _no_wake(self: SessionManager, key: SessionKey, *, arrived: bool) -> None:
    return None


SessionManager._wake = _no_wake  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main())
