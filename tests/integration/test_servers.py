"""The integration tests talk to the real servers the ops/ scripts start."""

from __future__ import annotations

import socket

from tests.conftest import CASSANDRA_HOSTS, CASSANDRA_PORT, ZOOKEEPER_HOSTS, cassandra_url


def test_cassandra_is_release_5(cassandra_keyspace):
    from scheduler.store.cassandra.store import CassandraStore

    store = CassandraStore(cassandra_url(cassandra_keyspace))
    try:
        assert store.release_version().startswith("5."), store.release_version()
        # The node that answered is the one the tests are configured for.
        wanted = {socket.gethostbyname(h.strip()) for h in CASSANDRA_HOSTS.split(",")}
        up = {(h.endpoint.address, h.endpoint.port) for h in store.session.cluster.metadata.all_hosts()
              if h.is_up}
        assert any(addr in wanted and port == CASSANDRA_PORT for addr, port in up), (up, wanted)
    finally:
        store.close()


def four_letter(word: str) -> str:
    host, _, port = ZOOKEEPER_HOSTS.split(",")[0].partition(":")
    with socket.create_connection((host, int(port or 2181)), timeout=5) as sock:
        sock.sendall(word.encode())
        chunks = []
        while data := sock.recv(4096):
            chunks.append(data)
    return b"".join(chunks).decode()


def test_zookeeper_reports_its_mode(zookeeper_available):
    srvr = four_letter("srvr")
    assert "Zookeeper version: 3." in srvr
    mode = [ln for ln in srvr.splitlines() if ln.startswith("Mode: ")]
    assert mode and mode[0].split(": ")[1] in ("standalone", "leader", "follower")


def test_kazoo_round_trip(zk_root):
    from kazoo.client import KazooClient

    zk = KazooClient(hosts=ZOOKEEPER_HOSTS)
    zk.start(timeout=10)
    try:
        zk.ensure_path(zk_root)
        zk.create(f"{zk_root}/member-", b"x", ephemeral=True, sequence=True)
        assert len(zk.get_children(zk_root)) == 1
    finally:
        zk.stop()
        zk.close()
