-- v008: each poller's part of a kind's fleet-wide rate (see
-- cql/versions/v008_flow_part.cql).
ALTER TABLE flow_demand ADD COLUMN part REAL;
