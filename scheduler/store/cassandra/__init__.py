"""The Cassandra store: one class (``store.CassandraStore``) put together from helpers by
role: connecting (``connect``, ``conf``, ``policy``), statement execution (``run``,
``bind``), firing, ownership, replays, schedules and the schema. Importing this package
imports nothing: the driver loads only with ``store``."""
