-- v004: where each poller listens for nudges (the same table as the Cassandra schema's
-- v004; expires_ms stands for its TTL).
CREATE TABLE IF NOT EXISTS notify_endpoints (
    owner TEXT PRIMARY KEY,
    address TEXT NOT NULL,
    expires_ms INTEGER NOT NULL
);
