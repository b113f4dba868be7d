-- Named queries of the embedded store, mirroring cql/queries.cql.

-- name: select_schema_version
SELECT max(version) FROM schema_versions;

-- name: insert_schema_version
INSERT INTO schema_versions (version, description, applied_at) VALUES (?, ?, ?);

-- name: select_meta
SELECT key, value FROM meta;

-- name: insert_meta
INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?);

-- name: select_layouts
SELECT from_bucket, shard_count, created_at FROM layouts;

-- name: insert_layout
INSERT OR IGNORE INTO layouts (from_bucket, shard_count, created_at) VALUES (?, ?, ?);

-- name: select_marks
SELECT from_bucket, max(mark) FROM layout_marks GROUP BY from_bucket;

-- name: insert_mark
INSERT OR IGNORE INTO layout_marks (from_bucket, mark) VALUES (?, ?);

-- name: select_jobs_in
-- {marks}: one ? per id (at most ID_CHUNK of them).
SELECT job_id, kind, payload, payload_json, due_at, fire_at, bucket, shard, status,
       attempts, fired_at, last_error, priority, key, traceparent
FROM jobs WHERE job_id IN ({marks});

-- name: select_job_positions
SELECT job_id, bucket, shard, fire_at FROM jobs WHERE bucket BETWEEN ? AND ?;

-- name: insert_job
INSERT OR REPLACE INTO jobs (job_id, kind, payload, payload_json, due_at, fire_at, bucket, shard,
                             status, attempts, fired_at, last_error, priority, key, traceparent, expires_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?);

-- name: insert_job_once
-- An occurrence that exists (fired, cancelled, retried) is left as it is.
INSERT OR IGNORE INTO jobs (job_id, kind, payload, payload_json, due_at, fire_at, bucket, shard,
                            status, attempts, fired_at, last_error, priority, key, traceparent, expires_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?);

-- name: insert_bucket_row
INSERT OR REPLACE INTO jobs_by_bucket (bucket, shard, fire_at, job_id, due_at, kind, payload,
                                       payload_json, attempts, priority, key, traceparent, expires_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?);

-- name: insert_bucket_row_full
INSERT OR REPLACE INTO jobs_by_bucket (bucket, shard, fire_at, job_id, due_at, kind, payload,
                                       payload_json, attempts, priority, key, traceparent, fired_at, expires_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?);

-- name: select_bucket_rows
SELECT bucket, shard, fire_at, job_id, due_at, kind, payload, payload_json, attempts, fired_at, priority, key,
       traceparent
FROM jobs_by_bucket
WHERE bucket = ? AND shard = ? AND (fire_at, job_id) > (?, ?) AND fire_at <= ?
ORDER BY fire_at, job_id
LIMIT ?;

-- name: select_checkpoint
SELECT bucket, cursor_fire_at, cursor_job_id, owner, owner_epoch FROM checkpoints WHERE shard = ?;

-- name: select_checkpoints
SELECT shard, bucket, cursor_fire_at, cursor_job_id, owner, owner_epoch, updated_at FROM checkpoints;

-- name: create_checkpoint
INSERT OR IGNORE INTO checkpoints (shard, bucket, owner, owner_epoch, updated_at) VALUES (?, ?, ?, ?, ?);

-- name: claim_checkpoint
UPDATE checkpoints SET owner = ?, owner_epoch = ?, updated_at = ? WHERE shard = ? AND owner_epoch < ?;

-- name: take_released_checkpoint
UPDATE checkpoints SET owner = ?, owner_epoch = ?, updated_at = ?
WHERE shard = ? AND owner IS NULL AND owner_epoch = ?;

-- name: save_checkpoint
UPDATE checkpoints SET bucket = ?, cursor_fire_at = ?, cursor_job_id = ?, updated_at = ?
WHERE shard = ? AND owner_epoch = ? AND bucket <= ?;

-- name: release_checkpoint
UPDATE checkpoints SET owner = NULL, updated_at = ? WHERE shard = ? AND owner_epoch = ?;

-- name: count_bucket_pending
SELECT count(*), min(fire_at) FROM jobs_by_bucket
WHERE bucket = ? AND shard = ? AND (fire_at, job_id) > (?, ?) AND fire_at <= ? AND fired_at IS NULL;

-- name: select_fired_at
SELECT fired_at FROM jobs_by_bucket WHERE bucket = ? AND shard = ? AND fire_at = ? AND job_id = ?;

-- name: mark_fired
UPDATE jobs_by_bucket SET fired_at = ? WHERE bucket = ? AND shard = ? AND fire_at = ? AND job_id = ?;

-- name: insert_dead_letter
INSERT OR REPLACE INTO dead_letters (part, job_id, kind, due_at, attempts, error, died_at, expires_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?);

-- name: select_dead_letters
SELECT job_id, kind, due_at, attempts, error, died_at FROM dead_letters WHERE part = ?;

-- name: select_dead_letters_after
SELECT job_id, kind, due_at, attempts, error, died_at FROM dead_letters
WHERE part = ? AND job_id > ? ORDER BY job_id LIMIT ?;

-- name: delete_dead_letter
DELETE FROM dead_letters WHERE part = ? AND job_id = ?;

-- name: insert_replay
INSERT OR REPLACE INTO replays (job_id, replayed_at, died_at, attempts, error, expires_at)
VALUES (?, ?, ?, ?, ?, ?);

-- name: select_replays
SELECT replayed_at, died_at, attempts, error FROM replays WHERE job_id = ?
ORDER BY replayed_at DESC LIMIT 100;

-- name: insert_schedule
INSERT OR IGNORE INTO schedules (schedule_id, version, state, kind, payload, payload_json, cron, every_s,
    tz, anchor_ms, start_ms, end_ms, overlap, misfire, catchup_window_s, jitter_s, created_ms, updated_ms, priority, key)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?);

-- name: replace_schedule
UPDATE schedules SET version = ?, state = ?, kind = ?, payload = ?, payload_json = ?, cron = ?,
    every_s = ?, tz = ?, anchor_ms = ?, start_ms = ?, end_ms = ?, overlap = ?, misfire = ?,
    catchup_window_s = ?, jitter_s = ?, created_ms = ?, updated_ms = ?, priority = ?, key = ?
WHERE schedule_id = ? AND version = ?;

-- name: select_schedule
SELECT schedule_id, version, state, kind, payload, payload_json, cron, every_s, tz, anchor_ms, start_ms,
       end_ms, overlap, misfire, catchup_window_s, jitter_s, created_ms, updated_ms, priority, key, skipped
FROM schedules WHERE schedule_id = ?;

-- name: select_schedules
SELECT schedule_id, version, state, kind, payload, payload_json, cron, every_s, tz, anchor_ms, start_ms,
       end_ms, overlap, misfire, catchup_window_s, jitter_s, created_ms, updated_ms, priority, key, skipped
FROM schedules ORDER BY schedule_id;

-- name: select_schedules_after
SELECT schedule_id, version, state, kind, payload, payload_json, cron, every_s, tz, anchor_ms, start_ms,
       end_ms, overlap, misfire, catchup_window_s, jitter_s, created_ms, updated_ms, priority, key, skipped
FROM schedules WHERE schedule_id > ? ORDER BY schedule_id LIMIT ?;

-- name: add_skipped
UPDATE schedules SET skipped = skipped + ? WHERE schedule_id = ?;

-- name: record_skipped
UPDATE jobs SET status = 'cancelled', last_error = ?, fired_at = ? WHERE job_id = ?;

-- name: update_meta
INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?);

-- The sweep that applies the retention (the embedded store has no TTLs).
-- name: sweep_bucket_rows
DELETE FROM jobs_by_bucket WHERE expires_at <= ?;

-- name: sweep_jobs
DELETE FROM jobs WHERE expires_at <= ?;

-- name: sweep_dead_letters
DELETE FROM dead_letters WHERE expires_at <= ?;

-- name: sweep_replays
DELETE FROM replays WHERE expires_at <= ?;

-- name: upsert_notify_endpoint
INSERT OR REPLACE INTO notify_endpoints (owner, address, expires_ms) VALUES (?, ?, ?);

-- name: delete_notify_endpoint
DELETE FROM notify_endpoints WHERE owner = ?;

-- name: select_notify_endpoints
SELECT owner, address FROM notify_endpoints WHERE expires_ms > ?;

-- Flow control (v006). NULL in a limit's parameter keeps the stored value.
-- name: set_flow_limits
INSERT INTO flow_limits (kind, rate_per_s, burst, concurrency, per_key_concurrency, paused, updated_ms)
VALUES (?, ?, ?, ?, ?, 0, ?)
ON CONFLICT (kind) DO UPDATE SET
    rate_per_s = coalesce(excluded.rate_per_s, rate_per_s),
    burst = coalesce(excluded.burst, burst),
    concurrency = coalesce(excluded.concurrency, concurrency),
    per_key_concurrency = coalesce(excluded.per_key_concurrency, per_key_concurrency),
    updated_ms = excluded.updated_ms;

-- name: set_flow_paused
INSERT INTO flow_limits (kind, paused, updated_ms) VALUES (?, ?, ?)
ON CONFLICT (kind) DO UPDATE SET paused = excluded.paused, updated_ms = excluded.updated_ms;

-- name: clear_flow_limits
UPDATE flow_limits SET rate_per_s = NULL, burst = NULL, concurrency = NULL, per_key_concurrency = NULL
WHERE kind = ?;

-- name: delete_empty_flow_limits
-- A row with no limit and no pause is the same as none: drop it (Cassandra's readers skip it).
DELETE FROM flow_limits WHERE kind = ? AND paused = 0 AND rate_per_s IS NULL AND burst IS NULL
    AND concurrency IS NULL AND per_key_concurrency IS NULL;

-- name: select_flow_limits
SELECT kind, rate_per_s, burst, concurrency, per_key_concurrency, paused, updated_ms
FROM flow_limits ORDER BY kind;

-- name: upsert_flow_demand
INSERT OR REPLACE INTO flow_demand (poller, kind, demand, running, at_ms, part, slots)
VALUES (?, ?, ?, ?, ?, ?, ?);

-- name: purge_flow_demand
DELETE FROM flow_demand WHERE at_ms < ?;

-- name: select_flow_demand
SELECT poller, kind, demand, running, at_ms, part, slots FROM flow_demand WHERE at_ms >= ? ORDER BY poller, kind;
