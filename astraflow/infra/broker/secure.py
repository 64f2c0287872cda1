"""The secure profile of the local broker: TLS, SCRAM users, and the KRaft ``StandardAuthorizer``.

``astraflow broker start --secure`` (with or without ``--nodes 3``) makes, once per broker home,
in ``HOME/security/`` (mode 0700, every file 0600 but the CA certificate):

- a local certificate authority (``ca.pem``, the file clients trust; ``ca.key``) and one node
  certificate (``node.pem``, key and chain; subject ``CN=kafka-node``, for 127.0.0.1 and
  localhost) made with the ``cryptography`` package;
- a random password per principal, ``<principal>.password``, the file a run's
  ``log.security.password_file`` names.

Who needs which file (everything else should be kept from it):

====================  ===========================================================================
file                  needed by
====================  ===========================================================================
``ca.pem``            every client and node: the certificate they trust (public)
``<role>.password``   the components of that role only (``feed`` -> ``feeder.password``, ...:
                      ``config.log.COMPONENT_ROLES``)
``admin.password``    whoever creates topics and grants: ``astraflow run``'s launcher, ``broker
                      grant``, ``broker quotas``
``node.pem``          the broker nodes only (their key: whoever holds it is the super user
                      ``kafka-node``)
``ca.key``            nothing that runs: only making or re-issuing ``node.pem`` (``make``)
====================  ===========================================================================

Locally all of them belong to the OS user who started the broker. To give a component only its own,
``astraflow broker credentials ROLE --out DIR`` (``SecurityFiles.export_role``) copies its password
and ``ca.pem`` into a directory of their own, with a ``log-security.yaml`` naming them, for another
OS user or a container to be given; the compose stack mounts one such directory per service.

Listeners, on 127.0.0.1 only:

- the client port: ``SASL_SSL`` with ``SCRAM-SHA-512``; the principal is the SCRAM user;
- an internal port for replication and the controller port: TLS with client certificates
  required; only the nodes hold one (``CN=kafka-node``, principal ``kafka-node``).

Principals: ``admin`` and ``kafka-node`` are super users (the admin creates topics and writes the
schema topic); every other principal may do only what its ACLs allow, and with no ACL nothing
(``allow.everyone.if.no.acl.found=false``). The SCRAM credentials are written when the storage is
formatted (KRaft's ``--add-scram``), so they exist before any client connects; the format command
carries them on its command line for the second it runs, where other local users could see them
in the process list (a dev broker on a shared machine should use ``--home`` on a private disk and
trust its users). What each component role may do on a run's topics is ``astraflow/infra/broker/acls.py``.

The compose stack's secure variant (``docker-compose.secure.yml``) runs the same nodes: ``astraflow
broker secure-config`` (``container.py``) writes these files and ``server_settings`` into a volume,
with listeners that bind the container's interfaces and advertise its hostname (``NodeAddress``),
and a node certificate that names those hostnames too.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from astraflow.config.log import ADMIN, ROLES
from astraflow.core.errors import BrokerError

MECHANISM = "SCRAM-SHA-512"
NODE = "kafka-node"
PRINCIPALS = (ADMIN, *ROLES)
"""``admin`` and the component roles, one SCRAM user each."""
LOOPBACK = ("localhost", "127.0.0.1")
ROLE_SECURITY = "log-security.yaml"
"""In a role's own directory (``SecurityFiles.export_role``): the ``log.security`` that logs in from it."""
_VALIDITY = datetime.timedelta(days=3650)
_JAAS = "org.apache.kafka.common.security.scram.ScramLoginModule required"


def _crypto():
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError as exc:  # pragma: no cover - a core dependency
        raise BrokerError("the secure broker needs the 'cryptography' package: rerun scripts/setup.sh") from exc
    return x509, hashes, serialization, ec, NameOID


def _pkcs8(serialization) -> tuple:
    """``private_bytes`` arguments for an unencrypted PEM key: the form Kafka's PEM keystore reads."""
    return serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()


def _san(x509, host: str):
    """A subject alternative name for ``host``: an IP address entry for an address, else a DNS name."""
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def write_private(path: Path, data: bytes) -> None:
    """Write a file only its owner may read: created 0600, so it is never readable by others, not even briefly."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
    os.chmod(path, 0o600)


@dataclass(frozen=True)
class SecurityFiles:
    """The TLS material and passwords of one secure broker home (``HOME/security``), or of the
    security volume of the compose stack (``container.py``)."""

    directory: Path
    hosts: tuple[str, ...] = LOOPBACK
    """What the node certificate is valid for (its SANs): the names and addresses clients and the
    other nodes reach a node by. Loopback for the local broker; the container hostnames too in compose."""

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def node(self) -> Path:
        return self.directory / "node.pem"

    def password_file(self, principal: str) -> Path:
        return self.directory / f"{principal}.password"

    def password(self, principal: str) -> str:
        try:
            return self.password_file(principal).read_text().strip()
        except FileNotFoundError as exc:
            raise BrokerError(f"no password for principal {principal!r} in {self.directory}") from exc

    def exists(self) -> bool:
        return all(path.exists() for path in (self.ca, self.ca_key, self.node)) and all(
            self.password_file(p).exists() for p in PRINCIPALS
        )

    def make(self) -> "SecurityFiles":
        """Create what is missing: passwords, the CA, and a node certificate for ``hosts``; returns self.

        Idempotent, so every start may call it: passwords and the CA are never replaced (the SCRAM
        credentials formatted into the storage and every client's trust depend on them); the node
        certificate is re-issued from the same CA when it does not name every host, so a home or a
        volume reused with more host names keeps working."""
        if self.exists() and self._node_covers_hosts():
            return self
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        for principal in PRINCIPALS:
            if not self.password_file(principal).exists():
                write_private(self.password_file(principal), (secrets.token_urlsafe(24) + "\n").encode())
        fresh_ca = not (self.ca.exists() and self.ca_key.exists())
        if fresh_ca:
            self._make_ca()
        if fresh_ca or not self.node.exists() or not self._node_covers_hosts():
            self._issue_node()
        return self

    def _make_ca(self) -> None:
        """A self-signed CA that may sign only end certificates (``path_length=0``): what clients trust."""
        x509, hashes, serialization, ec, NameOID = _crypto()
        now = datetime.datetime.now(datetime.timezone.utc)
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "astraflow local CA")])
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .sign(key, hashes.SHA256())
        )
        write_private(self.ca_key, key.private_bytes(*_pkcs8(serialization)))
        self.ca.write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def _issue_node(self) -> None:
        """Sign the node certificate (``CN=kafka-node``, a SAN per host) with this home's CA."""
        x509, hashes, serialization, ec, NameOID = _crypto()
        ca_key = serialization.load_pem_private_key(self.ca_key.read_bytes(), password=None)
        ca_cert = x509.load_pem_x509_certificate(self.ca.read_bytes())
        now = datetime.datetime.now(datetime.timezone.utc)
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, NODE)]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.SubjectAlternativeName([_san(x509, host) for host in self.hosts]), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH, x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .sign(ca_key, hashes.SHA256())
        )
        pem = serialization.Encoding.PEM
        write_private(
            self.node, key.private_bytes(*_pkcs8(serialization)) + cert.public_bytes(pem) + self.ca.read_bytes()
        )

    def node_hosts(self) -> set[str]:
        """The host names and addresses the node certificate is valid for (its SANs); empty without one."""
        if not self.node.exists():
            return set()
        x509 = _crypto()[0]
        cert = x509.load_pem_x509_certificates(self.node.read_bytes())[0]
        try:
            names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except x509.ExtensionNotFound:
            return set()
        return set(names.get_values_for_type(x509.DNSName)) | {
            str(address) for address in names.get_values_for_type(x509.IPAddress)
        }

    def _node_covers_hosts(self) -> bool:
        return set(self.hosts) <= self.node_hosts()

    def scram_arguments(self) -> list[str]:
        """``kafka-storage format`` arguments that create every principal's SCRAM credential."""
        arguments = []
        for principal in PRINCIPALS:
            arguments += ["--add-scram", f"{MECHANISM}=[name={principal},password={self.password(principal)}]"]
        return arguments

    def client_config(self, principal: str) -> dict[str, str]:
        """librdkafka settings for ``principal`` on the client port."""
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": MECHANISM,
            "sasl.username": principal,
            "sasl.password": self.password(principal),
            "ssl.ca.location": str(self.ca),
        }

    def log_security(self, principal: str) -> dict[str, str]:
        """The ``log.security`` section of a run config for ``principal``."""
        return {
            "protocol": "SASL_SSL",
            "sasl_mechanism": MECHANISM,
            "username": principal,
            "password_file": str(self.password_file(principal)),
            "ca_file": str(self.ca),
        }

    def role_security(self) -> dict[str, str]:
        """The ``log.security`` section that logs each component in as its own role
        (``role_credentials``): it names files, holds no secret."""
        return {
            "protocol": "SASL_SSL",
            "sasl_mechanism": MECHANISM,
            "role_credentials": str(self.directory),
            "ca_file": str(self.ca),
        }

    def export_role(self, principal: str, out: Path, mounted_at: Path | None = None) -> Path:
        """Copy what ``principal``'s components need into ``out`` and nothing else: its password
        (0600), ``ca.pem``, and a ``log-security.yaml`` (no secret) that logs them in from there
        (``role_credentials``, so each component still logs in as its own role and any other fails
        for want of its password file). ``out`` is made 0700; ``mounted_at`` is where the component
        will see it (a container's mount point), if not at ``out``. Returns the YAML file.

        For a deployment that runs each role as its own OS user or container: a component given
        only its role's directory cannot read another role's password, the admin's or the node key."""
        import yaml

        if principal not in PRINCIPALS:
            raise BrokerError(f"no principal {principal!r}: one of {', '.join(PRINCIPALS)}")
        out = Path(out)
        if out.resolve() == self.directory.resolve():
            raise BrokerError(f"{out} is the broker's security directory: give a directory for {principal} alone")
        password = self.password(principal)
        if not self.ca.exists():
            raise BrokerError(f"no CA certificate {self.ca}: start the broker with --secure first")
        others = sorted(path.name for path in out.glob("*.password") if path.name != f"{principal}.password")
        if others:
            raise BrokerError(f"{out} holds {', '.join(others)}: a role's directory must hold its own password only")
        out.mkdir(parents=True, exist_ok=True)
        os.chmod(out, 0o700)
        write_private(out / f"{principal}.password", (password + "\n").encode())
        (out / self.ca.name).write_bytes(self.ca.read_bytes())
        os.chmod(out / self.ca.name, 0o644)
        seen = Path(mounted_at) if mounted_at is not None else out.resolve()
        security = {**self.role_security(), "role_credentials": str(seen), "ca_file": str(seen / self.ca.name)}
        (out / ROLE_SECURITY).write_text(yaml.safe_dump(security, sort_keys=False))
        os.chmod(out / ROLE_SECURITY, 0o644)
        return out / ROLE_SECURITY

    def java_client_properties(self, principal: str) -> dict[str, str]:
        """Java client settings for ``principal`` on the client port, for Kafka's own command-line
        tools (``--command-config``); the password is in them."""
        password = self.password(principal)
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": MECHANISM,
            "sasl.jaas.config": f'{_JAAS} username="{principal}" password="{password}";',
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca),
        }


@dataclass(frozen=True)
class NodeAddress:
    """Where one node listens and the names it gives out for itself.

    The local broker binds and advertises 127.0.0.1. A node in a container binds every interface,
    advertises its hostname, and may take clients outside the container network too (``external``).
    """

    port: int
    """Client port (``SASL_SSL`` when secure, ``PLAINTEXT`` otherwise)."""
    controller_port: int
    internal_port: int | None = None
    """Secure nodes only: replication between the nodes, over mutual TLS."""
    host: str = "127.0.0.1"
    """The name clients and the other nodes reach this node by (advertised; in the certificate)."""
    bind: str = "127.0.0.1"
    """The interface every listener binds: 127.0.0.1 for the local broker, 0.0.0.0 in a container."""
    external: tuple[int, str] | None = None
    """Secure nodes only: a second SASL_SSL client listener (``HOST``) on this port, advertised as
    this ``host:port``: how the host reaches a container through a published port."""


def server_settings(files: SecurityFiles, address: NodeAddress) -> dict[str, str]:
    """The ``server.properties`` entries of a secure node (listeners, TLS, SASL, the authorizer).

    The one definition of a secure node: ``broker start --secure`` and the compose stack's
    ``broker secure-config`` both write it, and only the addresses differ."""
    if address.internal_port is None:
        raise BrokerError("a secure node needs an internal port: replication runs over its own mutual-TLS listener")
    ports = {"SASL_SSL": address.port, "INTERNAL": address.internal_port, "CONTROLLER": address.controller_port}
    advertised = [f"SASL_SSL://{address.host}:{address.port}", f"INTERNAL://{address.host}:{address.internal_port}"]
    protocols = {"SASL_SSL": "SASL_SSL", "INTERNAL": "SSL", "CONTROLLER": "SSL"}
    if address.external is not None:
        ports["HOST"] = address.external[0]
        advertised.append(f"HOST://{address.external[1]}")
        protocols["HOST"] = "SASL_SSL"
    settings = {
        "listeners": ",".join(f"{name}://{address.bind}:{port}" for name, port in ports.items()),
        "advertised.listeners": ",".join(advertised),
        "listener.security.protocol.map": ",".join(f"{name}:{protocol}" for name, protocol in protocols.items()),
        "inter.broker.listener.name": "INTERNAL",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(files.node),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(files.ca),
        "listener.name.internal.ssl.client.auth": "required",
        "listener.name.controller.ssl.client.auth": "required",
        "ssl.principal.mapping.rules": "RULE:^CN=([a-zA-Z0-9.-]+)$/$1/,DEFAULT",
        "sasl.enabled.mechanisms": MECHANISM,
    }
    for name in (name for name, protocol in protocols.items() if protocol == "SASL_SSL"):
        settings[f"listener.name.{name.lower()}.sasl.enabled.mechanisms"] = MECHANISM
        settings[f"listener.name.{name.lower()}.{MECHANISM.lower()}.sasl.jaas.config"] = f"{_JAAS};"
    settings.update(
        {
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": f"User:{ADMIN};User:{NODE}",
            "allow.everyone.if.no.acl.found": "false",
        }
    )
    return settings
