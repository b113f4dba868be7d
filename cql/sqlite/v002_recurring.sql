-- v002: recurring schedules (the same tables as the Cassandra schema's v002).
CREATE TABLE IF NOT EXISTS schedules (
    schedule_id TEXT PRIMARY KEY,
    version INTEGER NOT NULL,
    state TEXT NOT NULL,
    kind TEXT NOT NULL,
    payload BLOB NOT NULL,
    payload_json INTEGER NOT NULL,
    cron TEXT,
    every_s INTEGER,
    tz TEXT NOT NULL,
    anchor_ms INTEGER NOT NULL,
    start_ms INTEGER,
    end_ms INTEGER,
    overlap TEXT NOT NULL,
    misfire TEXT NOT NULL,
    catchup_window_s INTEGER NOT NULL,
    jitter_s INTEGER NOT NULL,
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    skipped INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
