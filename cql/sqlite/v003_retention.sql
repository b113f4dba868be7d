-- v003: retention. Each job row carries its expiry (epoch ms); a sweep deletes expired
-- rows (the Cassandra schema uses TTLs instead). Rows written before v003 have none
-- and never expire.
ALTER TABLE jobs_by_bucket ADD COLUMN expires_at INTEGER;
ALTER TABLE jobs ADD COLUMN expires_at INTEGER;
ALTER TABLE dead_letters ADD COLUMN expires_at INTEGER;
CREATE INDEX IF NOT EXISTS jobs_by_bucket_expiry ON jobs_by_bucket (expires_at);
CREATE INDEX IF NOT EXISTS jobs_expiry ON jobs (expires_at);
CREATE INDEX IF NOT EXISTS dead_letters_expiry ON dead_letters (expires_at);
