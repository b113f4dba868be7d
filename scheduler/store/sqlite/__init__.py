"""The embedded store (``sqlite://``): the same contract as Cassandra's in one file, for the
demo, tests and single-machine use (``store.SqliteStore``)."""
