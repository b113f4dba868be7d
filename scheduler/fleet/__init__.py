"""Who owns which shard: the coordinator protocol and its local implementation
(``coord``), the ZooKeeper one with fencing (``zkcoord``, ``zkconn``), coordinator URLs
(``url``) and a read-only view of the fleet (``view``) for the exporter and the console.
A fleet member, which runs pollers under a coordinator, is ``scheduler.runtime.member``."""
