"""The secure profile of the local broker: TLS, SCRAM users, and the KRaft ``StandardAuthorizer``.

``astraflow broker start --secure`` (with or without ``--nodes 3``) makes, once per broker home,
in ``HOME/security/`` (mode 0700, every file 0600 but the CA certificate):

- a local certificate authority (``ca.pem``, the file clients trust; ``ca.key``) and one node
  certificate (``node.pem``, key and chain; subject ``CN=kafka-node``, for 127.0.0.1 and
  localhost) made with the ``cryptography`` package;
- a random password per principal, ``<principal>.password``, the file a run's
  ``log.security.password_file`` names.

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
trust its users). What each component role may do on a run's topics is ``astraflow/acls.py``.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from astraflow.config.log import ADMIN, ROLES
from astraflow.errors import BrokerError

MECHANISM = "SCRAM-SHA-512"
NODE = "kafka-node"
PRINCIPALS = (ADMIN, *ROLES)
"""``admin`` and the component roles, one SCRAM user each."""


def _crypto():
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError as exc:  # pragma: no cover - a core dependency
        raise BrokerError("the secure broker needs the 'cryptography' package: rerun scripts/setup.sh") from exc
    return x509, hashes, serialization, ec, NameOID


def _write_private(path: Path, data: bytes) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
    os.chmod(path, 0o600)


@dataclass(frozen=True)
class SecurityFiles:
    """The TLS material and passwords of one secure broker home (``HOME/security``)."""

    directory: Path

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
        """Create the CA, the node certificate and the passwords unless they exist; returns self."""
        if self.exists():
            return self
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        for principal in PRINCIPALS:
            if not self.password_file(principal).exists():
                _write_private(self.password_file(principal), (secrets.token_urlsafe(24) + "\n").encode())
        if all(path.exists() for path in (self.ca, self.ca_key, self.node)):
            return self
        x509, hashes, serialization, ec, NameOID = _crypto()
        now = datetime.datetime.now(datetime.timezone.utc)
        ten_years = datetime.timedelta(days=3650)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "astraflow local CA")])
        ca_cert = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + ten_years)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .sign(ca_key, hashes.SHA256())
        )
        node_key = ec.generate_private_key(ec.SECP256R1())
        node_cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, NODE)]))
            .issuer_name(ca_name)
            .public_key(node_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + ten_years)
            .add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
            .add_extension(
                x509.ExtendedKeyUsage(
                    [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH, x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .sign(ca_key, hashes.SHA256())
        )
        pkcs8 = (serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        pem = serialization.Encoding.PEM
        _write_private(self.ca_key, ca_key.private_bytes(*pkcs8))
        self.ca.write_bytes(ca_cert.public_bytes(pem))
        _write_private(
            self.node, node_key.private_bytes(*pkcs8) + node_cert.public_bytes(pem) + ca_cert.public_bytes(pem)
        )
        return self

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


def server_settings(files: SecurityFiles, port: int, internal_port: int, controller_port: int) -> dict[str, str]:
    """The ``server.properties`` entries of a secure node (listeners, TLS, SASL, the authorizer)."""
    jaas = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    return {
        "listeners": (
            f"SASL_SSL://127.0.0.1:{port},INTERNAL://127.0.0.1:{internal_port},CONTROLLER://127.0.0.1:{controller_port}"
        ),
        "advertised.listeners": f"SASL_SSL://127.0.0.1:{port},INTERNAL://127.0.0.1:{internal_port}",
        "listener.security.protocol.map": "SASL_SSL:SASL_SSL,INTERNAL:SSL,CONTROLLER:SSL",
        "inter.broker.listener.name": "INTERNAL",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(files.node),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(files.ca),
        "listener.name.internal.ssl.client.auth": "required",
        "listener.name.controller.ssl.client.auth": "required",
        "ssl.principal.mapping.rules": "RULE:^CN=([a-zA-Z0-9.-]+)$/$1/,DEFAULT",
        "sasl.enabled.mechanisms": MECHANISM,
        "listener.name.sasl_ssl.sasl.enabled.mechanisms": MECHANISM,
        f"listener.name.sasl_ssl.{MECHANISM.lower()}.sasl.jaas.config": jaas,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": f"User:{ADMIN};User:{NODE}",
        "allow.everyone.if.no.acl.found": "false",
    }
