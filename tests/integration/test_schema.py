"""`scheduler schema apply` against a real Cassandra."""

from __future__ import annotations

import pytest

from scheduler.errors import ConfigError, SchemaError
from scheduler.store import SchemaOptions, open_store
from scheduler.store.base import SCHEMA_VERSION
from scheduler.store.cassandra.conf import replication_map
from scheduler.store.cassandra.store import CassandraStore
from tests.conftest import cassandra_url

T0_MS = 1_800_000_000_000


def test_apply_creates_records_version_and_is_idempotent(cassandra_keyspace):
    store = open_store(cassandra_url(cassandra_keyspace))
    try:
        first = store.apply_schema(SchemaOptions(shard_count=8, bucket_width_s=30), T0_MS)
        assert first.created and first.from_version == 0 and first.to_version == SCHEMA_VERSION
        assert first.meta.bucket_width_s == 30 and first.meta.origin_bucket == T0_MS // 1000
        again = store.apply_schema(SchemaOptions(shard_count=8, bucket_width_s=30), T0_MS + 5000)
        assert not again.created and again.from_version == SCHEMA_VERSION
        assert [lay.shard_count for lay in store.layouts()] == [8]
        with pytest.raises(ConfigError, match="uses 30s buckets"):
            store.apply_schema(SchemaOptions(bucket_width_s=60), T0_MS)
    finally:
        store.close()


def test_apply_refuses_a_newer_schema(cassandra_keyspace):
    store = open_store(cassandra_url(cassandra_keyspace))
    assert isinstance(store, CassandraStore)
    try:
        store.apply_schema(SchemaOptions(), T0_MS)
        store.session.execute(
            f"INSERT INTO {cassandra_keyspace}.schema_versions (id, version, description, applied_at) "
            "VALUES (0, 99, 'future', 0)")
        with pytest.raises(SchemaError, match="v99, newer than this scheduler"):
            store.apply_schema(SchemaOptions(), T0_MS)
    finally:
        store.close()


def test_missing_keyspace_is_a_schema_error(cassandra_keyspace):
    store = open_store(cassandra_url(cassandra_keyspace))
    try:
        with pytest.raises(SchemaError, match="scheduler schema apply"):
            store.meta()
    finally:
        store.close()


def test_replication_options(cassandra_keyspace):
    store = open_store(cassandra_url(cassandra_keyspace))
    assert isinstance(store, CassandraStore)
    try:
        store.apply_schema(SchemaOptions(replication="nts:datacenter1=1"), T0_MS)
        row = store.session.execute(
            "SELECT replication FROM system_schema.keyspaces WHERE keyspace_name = %s",
            (cassandra_keyspace,)).one()
        assert row[0]["class"].endswith("NetworkTopologyStrategy")
        assert row[0]["datacenter1"] == "1"
    finally:
        store.close()


@pytest.mark.parametrize("spec", ["simple:0", "nts:", "nts:dc1", "weird=3", "simple:x", "dc1:2,dc1:1"])
def test_bad_replication_specs(spec):
    with pytest.raises(ConfigError, match="replication"):
        replication_map(spec)
