-- v006: flow control (the same tables as the Cassandra schema's v006, without the
-- constant partition column; see cql/versions/v006_flow.cql for why each is keyed so).
-- flow_limits: one row per kind with a limit or a pause; NULL is "no such limit".
CREATE TABLE IF NOT EXISTS flow_limits (
    kind TEXT PRIMARY KEY,
    rate_per_s REAL,
    burst INTEGER,
    concurrency INTEGER,
    per_key_concurrency INTEGER,
    paused INTEGER NOT NULL DEFAULT 0,
    updated_ms INTEGER
) WITHOUT ROWID;
-- flow_demand: each poller's latest report per kind. No TTL here: readers drop rows
-- older than their max age by at_ms, and each publish purges rows past the TTL.
CREATE TABLE IF NOT EXISTS flow_demand (
    poller TEXT NOT NULL,
    kind TEXT NOT NULL,
    demand INTEGER NOT NULL,
    running INTEGER NOT NULL,
    at_ms INTEGER NOT NULL,
    PRIMARY KEY (poller, kind)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS flow_demand_at ON flow_demand (at_ms);
