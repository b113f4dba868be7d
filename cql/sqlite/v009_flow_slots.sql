-- v009: each poller's part of a kind's fleet-wide concurrency (see
-- cql/versions/v009_flow_slots.cql).
ALTER TABLE flow_demand ADD COLUMN slots INTEGER;
