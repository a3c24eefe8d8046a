"""SQLite schema migrations: (version, script), applied in order at start, idempotently."""

__all__ = ["MIGRATIONS"]

V1 = """
CREATE TABLE IF NOT EXISTS inbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session TEXT NOT NULL,
    channel TEXT NOT NULL,
    account TEXT NOT NULL,
    platform_id TEXT NOT NULL,
    payload TEXT NOT NULL,
    status TEXT NOT NULL,
    run_id TEXT,
    received_at REAL NOT NULL,
    UNIQUE (channel, account, platform_id)
);
CREATE INDEX IF NOT EXISTS inbox_pending ON inbox (session, id) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS inbox_run ON inbox (run_id);
CREATE TABLE IF NOT EXISTS sessions (
    key TEXT PRIMARY KEY,
    epoch INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL DEFAULT '{}',
    last_activity REAL,
    reset_at REAL NOT NULL DEFAULT 0,
    lease_owner TEXT,
    lease_until REAL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    reply TEXT,
    run_id TEXT,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_session ON messages (session, epoch, id);
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session TEXT NOT NULL,
    channel TEXT NOT NULL,
    run_id TEXT,
    seq INTEGER NOT NULL,
    reply TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'pending',
    attempts INTEGER NOT NULL DEFAULT 0,
    platform_id TEXT,
    delivery TEXT,
    error TEXT,
    created_at REAL NOT NULL,
    sent_at REAL
);
CREATE INDEX IF NOT EXISTS outbox_pending ON outbox (session, id) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS outbox_platform ON outbox (channel, platform_id);
CREATE TABLE IF NOT EXISTS channel_state (
    namespace TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (namespace, key)
);
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    session TEXT NOT NULL,
    status TEXT NOT NULL,
    started_at REAL NOT NULL,
    ended_at REAL,
    steps INTEGER NOT NULL,
    tool_calls INTEGER NOT NULL,
    input_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    limits_hit TEXT NOT NULL,
    error TEXT,
    inbox_ids TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_session ON runs (session, started_at);
"""

# v2: credits per run, and daily usage counters for quotas
V2 = """
ALTER TABLE runs ADD COLUMN credits REAL NOT NULL DEFAULT 0;
CREATE TABLE IF NOT EXISTS usage (
    day TEXT NOT NULL,
    scope TEXT NOT NULL,
    key TEXT NOT NULL,
    used REAL NOT NULL,
    PRIMARY KEY (day, scope, key)
);
"""

# v3: when a session last heard from its customer (the WhatsApp 24-hour window, Telegram's
# "blocked until they write again") by index: it was a scan of the whole inbox
V3 = """
CREATE INDEX IF NOT EXISTS inbox_received ON inbox (session, received_at);
"""

# v4: a reply part's retry_after (or backoff) outlasts a restart
V4 = """
ALTER TABLE outbox ADD COLUMN not_before REAL;
"""

# v5: the web chat's announcements keep no rows (one per conversation and start was kept)
V5 = """
DELETE FROM channel_state WHERE namespace = 'web.replies';
"""

# v6: the console's session list reads the sessions it shows, not every row (by index)
V6 = """
CREATE INDEX IF NOT EXISTS inbox_waiting ON inbox (session) WHERE status IN ('held', 'unpaired');
CREATE INDEX IF NOT EXISTS outbox_session ON outbox (session, id);
"""

MIGRATIONS: list[tuple[int, str]] = [(1, V1), (2, V2), (3, V3), (4, V4), (5, V5), (6, V6)]
