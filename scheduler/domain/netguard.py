"""Which network addresses an HTTP target may reach (the SSRF guard), and the allow list
that opens exceptions. Pure.

An address is *refused* when it is not on the public Internet: loopback, private
(RFC 1918), shared (carrier-grade NAT, RFC 6598), link-local, unique-local IPv6,
multicast, unspecified, documentation, benchmarking and reserved ranges (the IANA
special-purpose registries), and the cloud metadata services. An IPv6 address that
carries an IPv4 one (IPv4-mapped ``::ffff:a.b.c.d``, NAT64 ``64:ff9b::/96``, 6to4
``2002::/16``) is judged by the IPv4 address it carries as well, so no textual form of a
refused address gets through.

``SCHEDULER_HTTP_ALLOW`` (``AllowList``) lists the exceptions: host names, ``host:port``
pairs and networks (CIDR). A metadata address is allowed only by an entry that names it
alone (``169.254.169.254``, ``/32``), never by a wider network: allowing a link-local
range must not open the credentials endpoint of the machine.

Host names are checked here too (``check_host``): one that a resolver would read as an
IPv4 number (``2130706433``, ``127.1``, ``0x7f.1``) is refused, so the only IPv4 literal
is the dotted quad, which is judged as an address.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address, ip_network

from ..errors import InvalidInput

Address = IPv4Address | IPv6Address
Network = IPv4Network | IPv6Network

# The instance metadata services of the clouds (AWS, GCP, Azure, OpenStack and others at
# 169.254.169.254; ECS and EKS task credentials; Alibaba Cloud; AWS over IPv6).
METADATA: frozenset[Address] = frozenset(ip_address(a) for a in (
    "169.254.169.254", "169.254.170.2", "169.254.170.23", "100.100.100.200",
    "fd00:ec2::254", "fd00:ec2::23"))

_V4: tuple[tuple[IPv4Network, str], ...] = tuple((IPv4Network(n), why) for n, why in (
    ("0.0.0.0/8", "unspecified"),
    ("10.0.0.0/8", "private"),
    ("100.64.0.0/10", "shared (carrier-grade NAT)"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local"),
    ("172.16.0.0/12", "private"),
    ("192.0.0.0/24", "IETF protocol assignment"),
    ("192.0.2.0/24", "documentation"),
    ("192.88.99.0/24", "6to4 relay anycast"),
    ("192.168.0.0/16", "private"),
    ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", "documentation"),
    ("203.0.113.0/24", "documentation"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved"),  # 255.255.255.255, the broadcast address, included
))
_V6: tuple[tuple[IPv6Network, str], ...] = tuple((IPv6Network(n), why) for n, why in (
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("::/8", "reserved"),  # IPv4-compatible and -translated forms (mapped ones are unwrapped first)
    ("64:ff9b:1::/48", "private (local-use NAT64)"),
    ("100::/64", "discard-only"),
    ("2001:db8::/32", "documentation"),
    ("2001::/23", "IETF protocol assignment"),  # Teredo (2001::/32) included
    ("3fff::/20", "documentation"),
    ("fc00::/7", "unique-local"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local"),
    ("ff00::/8", "multicast"),
))
_MAPPED = IPv6Network("::ffff:0:0/96")
_NAT64 = IPv6Network("64:ff9b::/96")
_6TO4 = IPv6Network("2002::/16")


def plain(addr: Address) -> Address:
    """``addr`` without an IPv6 zone (``%eth0``), and an IPv4-mapped IPv6 address as the
    IPv4 address it is: what a socket connects to."""
    if isinstance(addr, IPv6Address):
        addr = IPv6Address(int(addr))
        if addr in _MAPPED:
            return IPv4Address(int(addr) & 0xFFFFFFFF)
    return addr


def carried_ipv4(addr: IPv6Address) -> IPv4Address | None:
    """The IPv4 address a NAT64 or 6to4 address leads to; None for other addresses."""
    if addr in _NAT64:
        return IPv4Address(int(addr) & 0xFFFFFFFF)
    if addr in _6TO4:
        return IPv4Address((int(addr) >> 80) & 0xFFFFFFFF)
    return None


def refusal(addr: Address) -> str | None:
    """Why ``addr`` is not a public address (``loopback``, ``private``, ``cloud
    metadata``...), or None when it is one."""
    addr = plain(addr)
    if addr in METADATA:
        return "cloud metadata"
    if isinstance(addr, IPv4Address):
        return next((why for net, why in _V4 if addr in net), None)
    inner = carried_ipv4(addr)
    if inner is not None:  # judged by where it leads (NAT64 is inside ::/8, reserved otherwise)
        why = refusal(inner)
        return None if why is None else f"{why} (IPv4 {inner} inside IPv6)"
    return next((why for net, why in _V6 if addr in net), None)


# --- host names -------------------------------------------------------------------

MAX_HOST_CHARS = 253
_LABEL = re.compile(r"^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?\Z")
_NUMERIC = re.compile(r"^(?:0x[0-9a-f]*|[0-9]+)\Z")


def check_host(host: str) -> str:
    """A DNS host name, lowercased and without a final dot; ``InvalidInput`` for anything
    else: empty, longer than 253 characters, a label that is not 1-63 letters, digits,
    ``-`` or ``_`` (a hyphen neither first nor last), or every label a number (a resolver
    reads ``127.1`` or ``2130706433`` as an IPv4 address). Not an IP address: see
    ``parse_host``."""
    name = host.lower()
    name = name[:-1] if name.endswith(".") else name
    if not name or len(name) > MAX_HOST_CHARS or not name.isascii():
        raise InvalidInput(f"host {_show(host)} is not a host name (ASCII letters, digits, '-' and '.', "
                           "at most 253 characters; give an IDN in its xn-- form)")
    labels = name.split(".")
    if not all(_LABEL.match(label) for label in labels):
        raise InvalidInput(f"host {_show(host)} is not a host name: each dot-separated label is 1-63 "
                           "letters, digits, '-' or '_', not starting or ending with '-'")
    if all(_NUMERIC.match(label) for label in labels):
        raise InvalidInput(f"host {_show(host)} is a number, not a host name: write an IPv4 address "
                           "as four decimal parts (a.b.c.d)")
    return name


def parse_host(host: str) -> tuple[str, Address | None]:
    """``host`` as it is compared (a lowercase name without a final dot, or an address's
    canonical text) and its address when it is a literal one: a dotted-quad IPv4 address
    or an IPv6 address (without brackets, without a zone). ``InvalidInput`` otherwise."""
    if ":" in host:
        if "%" in host:
            raise InvalidInput(f"host {_show(host)}: an IPv6 zone (%...) cannot be a target")
        try:
            addr6 = IPv6Address(host)
        except ValueError:
            raise InvalidInput(f"host {_show(host)} is not an IPv6 address") from None
        return addr6.compressed, addr6
    try:
        addr4 = IPv4Address(host)
    except ValueError:
        return check_host(host), None
    return str(addr4), addr4


def host_port(host: str, port: int) -> str:
    """``host:port`` as a URL writes it: an IPv6 address in brackets (``[::1]:80``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _show(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:80] + "...")


# --- the allow list -----------------------------------------------------------------

MAX_ALLOW_ENTRIES = 1000
ALLOW_FORMS = "host, host:port, IP address, [IPv6]:port or CIDR network (e.g. 10.0.0.0/8)"


@dataclass(frozen=True)
class AllowList:
    """The exceptions to the guard: ``hosts`` (names or canonical addresses, any port),
    ``host_ports`` (the same, one port) and ``networks``. Empty: nothing is excepted."""

    hosts: frozenset[str] = frozenset()
    host_ports: frozenset[tuple[str, int]] = frozenset()
    networks: tuple[Network, ...] = field(default=())

    def __bool__(self) -> bool:
        return bool(self.hosts or self.host_ports or self.networks)

    def allows(self, host: str, port: int, addr: Address) -> bool:
        """Whether the target ``host`` (as ``parse_host`` gives it) on ``port``, reached
        at ``addr``, is excepted: by its name or address, alone or with that port, or by a
        network holding ``addr`` (for a metadata address: a network of that one address)."""
        addr = plain(addr)
        text = str(addr)
        if host in self.hosts or text in self.hosts or (host, port) in self.host_ports \
                or (text, port) in self.host_ports:
            return True
        single = addr in METADATA
        return any(addr in net and (not single or net.num_addresses == 1) for net in self.networks
                   if net.version == addr.version)


def guard(host: str, port: int, addr: Address, allow: AllowList) -> str | None:
    """Why a request to ``host`` on ``port`` must not reach ``addr``, or None when it
    may: the address's ``refusal``, unless ``allow`` excepts it."""
    why = refusal(addr)
    if why is None or allow.allows(host, port, addr):
        return None
    return f"{plain(addr)} ({why}) is refused"


def parse_allow(text: str) -> AllowList:
    """``SCHEDULER_HTTP_ALLOW``: comma-separated entries (see ``ALLOW_FORMS``); blanks
    around them and empty entries are ignored. ``InvalidInput`` names the first bad
    entry: a network with host bits set, a port outside 1-65535, a wildcard, a name that
    ``check_host`` refuses, more than ``MAX_ALLOW_ENTRIES`` entries."""
    hosts: set[str] = set()
    host_ports: set[tuple[str, int]] = set()
    networks: list[Network] = []
    entries = [e.strip() for e in text.split(",") if e.strip()]
    if len(entries) > MAX_ALLOW_ENTRIES:
        raise InvalidInput(f"{len(entries)} entries; at most {MAX_ALLOW_ENTRIES} (use CIDR networks)")
    for entry in entries:
        try:
            _entry(entry, hosts, host_ports, networks)
        except InvalidInput as exc:
            raise InvalidInput(f"entry {_show(entry)}: {exc}; each entry is a {ALLOW_FORMS}") from None
    return AllowList(frozenset(hosts), frozenset(host_ports), tuple(networks))


def _entry(entry: str, hosts: set[str], host_ports: set[tuple[str, int]], networks: list[Network]) -> None:
    if "*" in entry:
        raise InvalidInput("wildcards are not supported: list each host, or a network")
    if "/" in entry:
        try:
            networks.append(ip_network(entry, strict=True))
        except ValueError as exc:
            raise InvalidInput(f"not a network ({exc})") from None
        return
    host, port = entry, None
    if entry.startswith("["):
        inside, bracket, rest = entry[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise InvalidInput("an IPv6 address in brackets is [address] or [address]:port")
        host, port = inside, (rest[1:] if rest else None)
        if ":" not in host:
            raise InvalidInput("brackets hold an IPv6 address")
    elif entry.count(":") == 1:
        host, port = entry.split(":")
    name, addr = parse_host(host)
    if addr is not None:
        addr = plain(addr)  # an IPv4-mapped address is the IPv4 one, as targets are judged
        name = str(addr)
    if port is None:
        if addr is not None:
            networks.append(ip_network(addr))
        else:
            hosts.add(name)
        return
    host_ports.add((name, parse_port(port)))


def parse_port(text: str) -> int:
    """A TCP port given as 1-5 ASCII digits, 1-65535; ``InvalidInput`` otherwise."""
    if not (text.isascii() and text.isdigit() and len(text) <= 5 and 1 <= int(text) <= 65535):
        raise InvalidInput(f"port {_show(text)} is not a number from 1 to 65535")
    return int(text)
