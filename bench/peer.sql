-- The peer: the single-table Postgres design the seeds describe (seed 003), which users
-- would otherwise pick. One table, a partial index on due_at for pending rows, claims
-- with FOR UPDATE SKIP LOCKED. Claim and mark happen in one statement (a CTE), which is
-- one round trip fewer than the seed's BEGIN/SELECT/UPDATE/COMMIT: the peer at its best.

-- name: drop_table
DROP TABLE IF EXISTS scheduled_jobs;

-- name: create_table
CREATE TABLE scheduled_jobs (
    id         text PRIMARY KEY,
    kind       text NOT NULL,
    payload    jsonb NOT NULL,
    due_at     timestamptz NOT NULL,
    pending    boolean NOT NULL DEFAULT true,
    claimed_at timestamptz,
    fired_at   timestamptz,
    attempts   int NOT NULL DEFAULT 0
);

-- name: create_index
CREATE INDEX scheduled_jobs_due ON scheduled_jobs (due_at) WHERE pending;

-- name: analyze
ANALYZE scheduled_jobs;

-- name: copy_jobs
COPY scheduled_jobs (id, kind, payload, due_at) FROM STDIN;

-- name: claim
WITH due AS (
    SELECT id FROM scheduled_jobs
    WHERE pending AND due_at <= now()
    ORDER BY due_at
    LIMIT %s
    FOR UPDATE SKIP LOCKED
)
UPDATE scheduled_jobs j
SET pending = false, claimed_at = now(), attempts = j.attempts + 1
FROM due WHERE j.id = due.id
RETURNING j.id, j.kind, j.payload, (extract(epoch FROM j.due_at) * 1000)::bigint;

-- name: complete
UPDATE scheduled_jobs SET fired_at = now() WHERE id = ANY(%s);

-- name: count_unfired
SELECT count(*) FROM scheduled_jobs WHERE fired_at IS NULL AND due_at <= now();

-- name: server_version
SHOW server_version;

-- name: vacuum
VACUUM (ANALYZE) scheduled_jobs;
