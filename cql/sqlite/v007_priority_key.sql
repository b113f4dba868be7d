-- v007: a job's priority and key on both of its rows and on a schedule's row (see
-- cql/versions/v007_priority_key.cql). NULL in a row written before v007 reads as
-- priority 5 (the default) and no key.
ALTER TABLE jobs_by_bucket ADD COLUMN priority INTEGER;
ALTER TABLE jobs_by_bucket ADD COLUMN key TEXT;
ALTER TABLE jobs ADD COLUMN priority INTEGER;
ALTER TABLE jobs ADD COLUMN key TEXT;
ALTER TABLE schedules ADD COLUMN priority INTEGER;
ALTER TABLE schedules ADD COLUMN key TEXT;
