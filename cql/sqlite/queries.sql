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

-- name: select_job
SELECT job_id, kind, payload, payload_json, due_at, fire_at, bucket, shard, status,
       attempts, fired_at, last_error
FROM jobs WHERE job_id = ?;

-- name: insert_job
INSERT OR REPLACE INTO jobs (job_id, kind, payload, payload_json, due_at, fire_at, bucket, shard,
                             status, attempts, fired_at, last_error)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?);

-- name: set_job_status
UPDATE jobs SET status = ? WHERE job_id = ?;

-- name: insert_bucket_row
INSERT OR REPLACE INTO jobs_by_bucket (bucket, shard, fire_at, job_id, due_at, kind, payload,
                                       payload_json, attempts)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?);

-- name: delete_bucket_row
DELETE FROM jobs_by_bucket WHERE bucket = ? AND shard = ? AND fire_at = ? AND job_id = ?;

-- name: select_bucket_rows
SELECT bucket, shard, fire_at, job_id, due_at, kind, payload, payload_json, attempts
FROM jobs_by_bucket
WHERE bucket = ? AND shard = ? AND (fire_at, job_id) > (?, ?) AND fire_at <= ?
ORDER BY fire_at, job_id
LIMIT ?;
