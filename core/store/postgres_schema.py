"""PostgreSQL schema migrations: (version, SQL), applied in order at start under an advisory
lock, so replicas starting together apply each one exactly once."""

__all__ = ["MIGRATIONS"]

V1 = """
CREATE TABLE IF NOT EXISTS inbox (
    id BIGSERIAL PRIMARY KEY,
    session TEXT NOT NULL,
    channel TEXT NOT NULL,
    account TEXT NOT NULL,
    platform_id TEXT NOT NULL,
    payload TEXT NOT NULL,
    status TEXT NOT NULL,
    run_id TEXT,
    received_at DOUBLE PRECISION NOT NULL,
    UNIQUE (channel, account, platform_id)
);
CREATE INDEX IF NOT EXISTS inbox_pending ON inbox (session, id) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS inbox_run ON inbox (run_id);
CREATE TABLE IF NOT EXISTS sessions (
    key TEXT PRIMARY KEY,
    epoch INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL DEFAULT '{}',
    last_activity DOUBLE PRECISION,
    reset_at DOUBLE PRECISION NOT NULL DEFAULT 0,
    lease_owner TEXT,
    lease_until DOUBLE PRECISION
);
CREATE TABLE IF NOT EXISTS messages (
    id BIGSERIAL PRIMARY KEY,
    session TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    reply TEXT,
    run_id TEXT,
    created_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_session ON messages (session, epoch, id);
CREATE TABLE IF NOT EXISTS outbox (
    id BIGSERIAL PRIMARY KEY,
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
    created_at DOUBLE PRECISION NOT NULL,
    sent_at DOUBLE PRECISION
);
CREATE INDEX IF NOT EXISTS outbox_pending ON outbox (session, id) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS outbox_platform ON outbox (channel, platform_id);
CREATE TABLE IF NOT EXISTS channel_state (
    namespace TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (namespace, key)
);
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    session TEXT NOT NULL,
    status TEXT NOT NULL,
    started_at DOUBLE PRECISION NOT NULL,
    ended_at DOUBLE PRECISION,
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
ALTER TABLE runs ADD COLUMN IF NOT EXISTS credits DOUBLE PRECISION NOT NULL DEFAULT 0;
CREATE TABLE IF NOT EXISTS usage (
    day TEXT NOT NULL,
    scope TEXT NOT NULL,
    key TEXT NOT NULL,
    used DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (day, scope, key)
);
"""

# v3: storing an inbound message in one round trip (it was seven: begin, four statements, the
# notify, commit). Each statement inside sees what committed before it, and the upsert locks
# the session row first, so the pending count and the insert stay one step per session.
V3 = """
CREATE OR REPLACE FUNCTION sb_put_inbound(
    p_session TEXT, p_channel TEXT, p_account TEXT, p_platform_id TEXT, p_payload TEXT,
    p_unpaired BOOLEAN, p_max_pending BIGINT, p_received_at DOUBLE PRECISION,
    p_now DOUBLE PRECISION, p_notify_channel TEXT, p_notify_payload TEXT,
    OUT out_id BIGINT, OUT out_status TEXT
) LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO sessions (key, last_activity) VALUES (p_session, p_now)
        ON CONFLICT (key) DO UPDATE SET last_activity = excluded.last_activity;
    SELECT i.id INTO out_id FROM inbox i
        WHERE i.channel = p_channel AND i.account = p_account AND i.platform_id = p_platform_id;
    IF out_id IS NOT NULL THEN
        out_status := 'duplicate';
        RETURN;
    END IF;
    IF p_unpaired THEN
        out_status := 'unpaired';
    ELSIF (SELECT count(*) FROM inbox i WHERE i.session = p_session AND i.status = 'pending')
            < p_max_pending THEN
        out_status := 'pending';
    ELSE
        out_status := 'overflow';
    END IF;
    INSERT INTO inbox (session, channel, account, platform_id, payload, status, received_at)
        VALUES (p_session, p_channel, p_account, p_platform_id, p_payload, out_status,
                p_received_at)
        ON CONFLICT (channel, account, platform_id) DO NOTHING
        RETURNING id INTO out_id;
    IF out_id IS NULL THEN  -- another replica stored the same delivery a moment ago
        SELECT i.id INTO out_id FROM inbox i WHERE i.channel = p_channel
            AND i.account = p_account AND i.platform_id = p_platform_id;
        out_status := 'duplicate';
        RETURN;
    END IF;
    IF out_status = 'pending' THEN
        PERFORM pg_notify(p_notify_channel, p_notify_payload);
    END IF;
END
$$;
"""

# v4: when a session last heard from its customer (the WhatsApp 24-hour window, Telegram's
# "blocked until they write again") by index: it was a scan of the whole inbox
V4 = """
CREATE INDEX IF NOT EXISTS inbox_received ON inbox (session, received_at);
"""

# v5: a reply part's retry_after (or backoff) outlasts a restart
V5 = """
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS not_before DOUBLE PRECISION;
"""

# v6: the web chat's announcements keep no rows (one per conversation and start was kept)
V6 = """
DELETE FROM channel_state WHERE namespace = 'web.replies';
"""

# v7: the console's session list reads the sessions it shows, not every row (by index)
V7 = """
CREATE INDEX IF NOT EXISTS inbox_waiting ON inbox (session) WHERE status IN ('held', 'unpaired');
CREATE INDEX IF NOT EXISTS outbox_session ON outbox (session, id);
"""

# v8: inbound messages in one round trip and one transaction (core.store.grouped):
# sb_put_inbound for each, in the order given, numbered; identical NOTIFYs of one transaction
# are one. A row lock waited on past p_lock_timeout_ms fails the call (55P03): a session
# another replica is committing holds up the others that long at most
V8 = """
CREATE OR REPLACE FUNCTION sb_put_inbound_many(
    p_sessions TEXT[], p_channels TEXT[], p_accounts TEXT[], p_platform_ids TEXT[],
    p_payloads TEXT[], p_unpaired BOOLEAN[], p_max_pending BIGINT[],
    p_received_at DOUBLE PRECISION[], p_now DOUBLE PRECISION, p_notify_channel TEXT,
    p_notify_payloads TEXT[], p_lock_timeout_ms INTEGER
) RETURNS TABLE (out_n INTEGER, out_id BIGINT, out_status TEXT) LANGUAGE plpgsql AS $$
DECLARE
    one RECORD;
BEGIN
    PERFORM set_config('lock_timeout', p_lock_timeout_ms::text, true);
    FOR i IN 1 .. coalesce(array_length(p_sessions, 1), 0) LOOP
        SELECT * INTO one FROM sb_put_inbound(
            p_sessions[i], p_channels[i], p_accounts[i], p_platform_ids[i], p_payloads[i],
            p_unpaired[i], p_max_pending[i], p_received_at[i], p_now, p_notify_channel,
            p_notify_payloads[i]);
        out_n := i;
        out_id := one.out_id;
        out_status := one.out_status;
        RETURN NEXT;
    END LOOP;
END
$$;
"""

MIGRATIONS: list[tuple[int, str]] = [
    (1, V1),
    (2, V2),
    (3, V3),
    (4, V4),
    (5, V5),
    (6, V6),
    (7, V7),
    (8, V8),
]
