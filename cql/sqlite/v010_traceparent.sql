-- v010: a job's W3C traceparent on both of its rows (see
-- cql/versions/v010_traceparent.cql). NULL in a row written before v010.
ALTER TABLE jobs_by_bucket ADD COLUMN traceparent TEXT;
ALTER TABLE jobs ADD COLUMN traceparent TEXT;
