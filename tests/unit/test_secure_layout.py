"""What ops/secure-stack generates, without its servers: one folder per role holding only
that role's files, every secret at mode 0600 in folders at 0700, client certificates
that serve no server, and a compose override in which each service mounts only its own
folder. Generated once into a temporary data folder (`compose-files` makes the stack's
files and the compose copies)."""

from __future__ import annotations

import os
import re
import socket
import ssl
import stat
import subprocess
import threading
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

ROOT = Path(__file__).parents[2]
ROLES = ("admin", "app", "reader")
CLIENT_FILES = {"ca.pem", "cassandra.pw", "client.crt", "client.key"}
# What each role's folder holds, here and in the compose copy (where app's reader id is
# in app.env instead).
EXPECTED = {"admin": CLIENT_FILES, "app": CLIENT_FILES | {"zk.auth", "zk-readers.id"},
            "reader": CLIENT_FILES | {"zk.auth"}}


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("data")
    res = subprocess.run([str(ROOT / "ops" / "secure-stack"), "compose-files"], capture_output=True,
                         text=True, env={**os.environ, "SCHEDULER_DATA_DIR": str(data)}, timeout=300)
    assert res.returncode == 0, res.stderr
    return data / "secure"


def own_secrets(secure: Path) -> dict[str, set[str]]:
    """The secret values (passwords, digest credentials) each holder owns."""
    def read(p: Path) -> set[str]:
        value = p.read_text().strip()
        return {value, value.partition(":")[2]} - {""}

    owned = {"ca": read(secure / "ca" / "ca.pw"), "server": read(secure / "server" / "keystore.pw")}
    for role in ROLES:
        folder = secure / "roles" / role
        owned[role] = read(folder / "cassandra.pw") | (read(folder / "zk.auth") if role != "admin" else set())
        owned[role] |= {line for line in (folder / "client.key").read_text().splitlines()[1:4]}
    return owned


def test_every_secret_is_mode_600_in_a_folder_at_700(secure: Path):
    assert stat.S_IMODE(secure.stat().st_mode) == 0o700
    checked = 0
    for top in ("ca", "server", "roles", "compose"):
        for path in [secure / top, *(secure / top).rglob("*")]:
            mode = stat.S_IMODE(path.stat().st_mode)
            assert mode == (0o700 if path.is_dir() else 0o600), f"{path.relative_to(secure)}: {oct(mode)}"
            checked += 1
    assert checked > 30


@pytest.mark.parametrize("where", ["roles", "compose/roles"])
def test_each_role_folder_holds_only_that_roles_files(secure: Path, where: str):
    owned = own_secrets(secure)
    for role in ROLES:
        folder = secure / where / role
        names = {p.name for p in folder.iterdir()}
        expected = EXPECTED[role] - ({"zk-readers.id"} if where != "roles" else set())
        assert names == expected, (role, names ^ expected)
        text = "\n".join(p.read_text() for p in folder.iterdir())
        others = [holder for holder, values in owned.items()
                  if holder != role and any(v in text for v in values)]
        assert not others, f"{where}/{role} holds secrets of {others}"
    # The exporter's (reader's) folder in particular: no admin password, no server keystore,
    # no keystore password, no CA key.
    reader = secure / where / "reader"
    assert not list(reader.glob("*.p12")) and not list(reader.glob("admin*"))
    text = "\n".join(p.read_text() for p in reader.iterdir())
    assert not any(secret in text for secret in owned["admin"] | owned["server"] | owned["ca"])


def x509_text(pem: Path) -> str:
    return subprocess.run(["openssl", "x509", "-in", str(pem), "-noout", "-text"], check=True,
                          capture_output=True, text=True).stdout


def extension(text: str, name: str) -> str | None:
    """The value line of an X.509v3 extension in ``openssl x509 -text`` output."""
    m = re.search(rf"X509v3 {name}:(?: critical)? *\n\s+(.+)", text)
    return m.group(1).strip() if m else None


def server_pem(secure: Path, out: Path) -> tuple[Path, Path]:
    """The servers' certificate and key out of their keystore, as PEM files."""
    server = secure / "server"
    crt, key = out / "server.crt", out / "server.key"
    common = ["openssl", "pkcs12", "-in", str(server / "server.p12"),
              "-passin", f"file:{server / 'keystore.pw'}"]
    subprocess.run([*common, "-clcerts", "-nokeys", "-out", str(crt)], check=True, capture_output=True)
    subprocess.run([*common, "-nocerts", "-nodes", "-out", str(key)], check=True, capture_output=True)
    return crt, key


def test_client_certificates_are_one_per_role_for_client_use_only(secure: Path, tmp_path: Path):
    keys = set()
    for role in ROLES:
        text = x509_text(secure / "roles" / role / "client.crt")
        assert re.search(rf"Subject: CN ?= ?{role}\n", text), text
        assert extension(text, "Extended Key Usage") == "TLS Web Client Authentication"
        assert extension(text, "Subject Alternative Name") is None
        keys.add(re.sub(r"\s", "", text.split("Modulus:")[1].split("Exponent")[0]))
        compose_copy = secure / "compose" / "roles" / role / "client.crt"
        assert compose_copy.read_text() == (secure / "roles" / role / "client.crt").read_text()
    assert len(keys) == len(ROLES), "every role has its own key"
    crt, _ = server_pem(secure, tmp_path)
    text = x509_text(crt)
    assert extension(text, "Extended Key Usage") == "TLS Web Server Authentication"
    assert "DNS:localhost" in (extension(text, "Subject Alternative Name") or "")


def handshake(cert: Path, key: Path, ca: Path, check_hostname: bool) -> str | None:
    """A TLS client trusting ``ca`` connects to a server presenting ``cert`` as
    ``localhost``: None when it accepts the server, else OpenSSL's reason."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(str(cert), str(key))
    client_ctx = ssl.create_default_context(cafile=str(ca))
    client_ctx.check_hostname = check_hostname
    a, b = socket.socketpair()
    a.settimeout(30)
    b.settimeout(30)

    def serve() -> None:
        try:
            with server_ctx.wrap_socket(a, server_side=True):
                pass
        except (ssl.SSLError, OSError):
            pass  # the client refused us: what the caller asks about

    server = threading.Thread(target=serve)
    server.start()
    try:
        with client_ctx.wrap_socket(b, server_hostname="localhost"):
            return None
    except ssl.SSLCertVerificationError as exc:
        return cast(Any, exc).verify_message or str(exc)
    finally:
        b.close()
        server.join(30)
        a.close()


def test_a_client_certificate_is_refused_as_a_server_certificate(secure: Path, tmp_path: Path):
    ca = secure / "ca" / "ca.pem"
    crt, key = server_pem(secure, tmp_path)
    assert handshake(crt, key, ca, check_hostname=True) is None  # the harness accepts a real server
    for role in ROLES:
        folder = secure / "roles" / role
        # Its purpose alone refuses it, and without a DNS name it matches no host either.
        assert handshake(folder / "client.crt", folder / "client.key", ca, check_hostname=False) \
            == "unsuitable certificate purpose"
        assert handshake(folder / "client.crt", folder / "client.key", ca, check_hostname=True) is not None


def override() -> dict[str, Any]:
    return cast(dict[str, Any], yaml.safe_load((ROOT / "docker-compose.secure.yml").read_text()))


def test_each_compose_service_mounts_only_its_own_folder(secure: Path):
    services = override()["services"]
    base = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    # Every scheduler service of the base is secured (none is left on the plain ports).
    assert {n for n, s in base.items() if s.get("image", "").startswith("scheduler")} <= set(services)
    role_of = {"schema": None, "exporter": "reader", "console": "reader", "api": "app",
               **{n: "app" for n in services if n.startswith("poller-")}}
    for name, svc in services.items():
        volumes = svc["volumes"]
        assert len(volumes) == 1, (name, volumes)
        host, container, *mode = volumes[0].split(":")
        if name in ("cassandra", "zookeeper"):
            assert (host, container, mode) == (f"./.data/secure/compose/{name}", "/secure", ["ro"])
            # The entrypoint copies every file of the folder for the server's own user, to
            # where the configuration points.
            copy = re.search(r"install -o (\w+) -g \1 -m 600 (.+?) (/\S+/) &&", svc["entrypoint"][2])
            assert copy, svc["entrypoint"]
            folder = secure / "compose" / name
            assert {Path(p).name for p in copy.group(2).split()} == {p.name for p in folder.iterdir()}
            config = next(p for p in folder.iterdir() if p.suffix in (".yaml", ".cfg")).read_text()
            paths = set(re.findall(r"(/[\w/.]+\.p12)", config))
            assert paths and all(p.startswith(copy.group(3)) for p in paths), paths
        elif role_of[name] is None:  # the admin's one-off job: creates logins, rotates passwords
            assert (host, container, mode) == ("./.data/secure/compose/roles", "/secure/roles", [])
            assert svc["env_file"] == [".data/secure/compose/admin.env"]
        else:
            role = role_of[name]
            assert host == f"./.data/secure/compose/roles/{role}", name
            assert (container, mode) == (f"/secure/roles/{role}", ["ro"]), name
            assert svc["env_file"] == [f".data/secure/compose/{role}.env"]
            assert svc["environment"]["SCHEDULER_STORE"].startswith(f"cassandra://{role}@")
            env = (secure / svc["env_file"][0].removeprefix(".data/secure/")).read_text()
            named = re.findall(r"=(/secure/\S+)", env)
            assert named and all(p.startswith(f"/secure/roles/{role}/") for p in named), named
            assert all((secure / "compose" / p.removeprefix("/secure/")).is_file() for p in named)
