"""The ``log`` section: which log joins the components."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from astraflow.config.base import Section
from astraflow.core.errors import ConfigError

ADMIN = "admin"
"""The principal that creates a run's topics and grants its ACLs (the launcher, ``broker grant``)."""
COMPONENT_ROLES = {
    "feed": "feeder",
    "rollout": "producer",
    "stream": "stream",
    "train": "trainer",
    "evaluate": "evaluator",
    "scale": "scaler",
    "analysis": "analysis",
}
"""The principal each component logs in as with ``log.security.role_credentials``; anything else
that opens the log (the launcher, replay, ``broker grant``) is ``admin``."""
ROLES = tuple(dict.fromkeys(COMPONENT_ROLES.values()))


class KafkaSecurity(Section):
    """How the Kafka clients authenticate and encrypt (Kafka only: the embedded log is a file of one
    user, created mode 0600). The password is never a config value: it is read, when a client is
    made, from the environment variable ``password_env`` or the file ``password_file``, so neither
    the resolved ``config.yaml`` nor a log line holds it."""

    protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    """Kafka's ``security.protocol``: TLS (``SSL``), SASL authentication, both, or neither."""
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    """With a ``SASL_*`` protocol: the SASL mechanism (both client libraries support these three)."""
    username: str | None = None
    """With a ``SASL_*`` protocol: the principal's user name."""
    password_env: str | None = None
    """With a ``SASL_*`` protocol: the environment variable holding the password (or ``password_file``)."""
    password_file: str | None = None
    """With a ``SASL_*`` protocol: a file holding the password, alone on its first line (or ``password_env``)."""
    ca_file: str | None = None
    """With TLS: the CA certificate (PEM) the brokers' certificates are checked against; the system's CAs if unset."""
    cert_file: str | None = None
    """With TLS: this client's certificate (PEM), for brokers that authenticate clients by certificate."""
    key_file: str | None = None
    """With ``cert_file``: its private key (PEM, unencrypted)."""
    role_credentials: str | None = None
    (
        "With a ``SASL_*`` protocol, instead of ``username`` and a password: a directory holding "
        "``<principal>.password`` per principal (``astraflow broker start --secure`` makes ``HOME/security``). "
        "Each component then logs in as its role (feeder, producer, stream, trainer, evaluator, scaler), "
        "analysis commands as ``analysis``, and the launcher as ``admin``, which creates the run's topics "
        "and grants each role its ACLs."
    )

    @model_validator(mode="after")
    def _settings_fit_the_protocol(self) -> "KafkaSecurity":
        sasl_fields = {"sasl_mechanism": self.sasl_mechanism, "username": self.username}
        secrets = {"password_env": self.password_env, "password_file": self.password_file}
        tls_fields = {"ca_file": self.ca_file, "cert_file": self.cert_file, "key_file": self.key_file}
        if self.sasl and self.role_credentials:
            given = [name for name, value in {"username": self.username, **secrets}.items() if value]
            if given:
                raise ValueError(f"{', '.join(given)}: not with role_credentials, which names each role's user")
            if not self.sasl_mechanism:
                raise ValueError(f"protocol {self.protocol} needs sasl_mechanism")
        elif self.sasl:
            missing = [name for name, value in sasl_fields.items() if not value]
            if missing:
                raise ValueError(f"protocol {self.protocol} needs {' and '.join(missing)}")
            if sum(bool(value) for value in secrets.values()) != 1:
                raise ValueError(f"protocol {self.protocol} needs exactly one of password_env and password_file")
        else:
            sasl_fields["role_credentials"] = self.role_credentials
            given = [name for name, value in {**sasl_fields, **secrets}.items() if value]
            if given:
                raise ValueError(f"{', '.join(given)}: only with a SASL_PLAINTEXT or SASL_SSL protocol")
        if not self.tls:
            given = [name for name, value in tls_fields.items() if value]
            if given:
                raise ValueError(f"{', '.join(given)}: only with an SSL or SASL_SSL protocol")
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("cert_file and key_file go together")
        return self

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.protocol.endswith("SSL")

    def principal(self, component: str | None = None) -> str | None:
        """The SASL user ``component`` logs in as (its role with ``role_credentials``); ``None`` without SASL."""
        if not self.sasl:
            return None
        if self.role_credentials:
            return COMPONENT_ROLES.get(component or "", ADMIN)
        return self.username

    def password(self, component: str | None = None) -> str:
        """The SASL password of ``component``'s principal, read now from ``password_env``,
        ``password_file`` or the role's file in ``role_credentials``."""
        if self.role_credentials:
            path = Path(self.role_credentials) / f"{self.principal(component)}.password"
            try:
                value = path.read_text().strip()
            except OSError as exc:
                raise ConfigError(f"log.security.role_credentials: cannot read {path}: {exc.strerror}") from exc
            if not value:
                raise ConfigError(f"log.security.role_credentials: {path} is empty")
            return value
        if self.password_env:
            value = os.environ.get(self.password_env)
            if not value:
                raise ConfigError(f"log.security.password_env: the environment variable {self.password_env} is not set")
            return value
        path = Path(self.password_file or "")
        try:
            lines = path.read_text().splitlines()
        except OSError as exc:
            raise ConfigError(f"log.security.password_file: cannot read {path}: {exc.strerror}") from exc
        if not lines or not lines[0]:
            raise ConfigError(f"log.security.password_file: {path} is empty")
        return lines[0]

    def client_config(self, component: str | None = None) -> dict[str, str]:
        """The librdkafka (confluent-kafka) settings of ``component`` (its principal, with
        ``role_credentials``), the password included: for a client, never to print."""
        settings = {"security.protocol": self.protocol}
        if self.sasl:
            settings.update(
                {
                    "sasl.mechanism": self.sasl_mechanism or "",
                    "sasl.username": self.principal(component) or "",
                    "sasl.password": self.password(component),
                }
            )
        for key, value in (
            ("ssl.ca.location", self.ca_file),
            ("ssl.certificate.location", self.cert_file),
            ("ssl.key.location", self.key_file),
        ):
            if value:
                settings[key] = value
        return settings


def load_security(path: Path) -> KafkaSecurity:
    """The ``log.security`` section in the YAML file ``path``: a run config (its ``log.security``) or
    the section alone, for commands that reach a cluster by ``--bootstrap`` without a run config."""
    import yaml
    from pydantic import ValidationError

    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"--security {path}: cannot read it: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"--security {path}: not YAML: {exc}") from exc
    if isinstance(data, dict) and isinstance(data.get("log"), dict):
        data = data["log"].get("security")
        if data is None:
            raise ConfigError(f"--security {path}: a run config without log.security")
    if not isinstance(data, dict):
        raise ConfigError(f"--security {path}: expected a log.security mapping (protocol, sasl_mechanism, ...)")
    try:
        return KafkaSecurity.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'security'}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"--security {path}: {problems}") from exc


def security_client_config(security: KafkaSecurity | None, component: str | None) -> dict[str, str]:
    """The Kafka client settings of ``component`` under ``security`` (none when it is unset or PLAINTEXT)."""
    if security is None or security.protocol == "PLAINTEXT":
        return {}
    return security.client_config(component)


class LogConfig(Section):
    backend: Literal["embedded", "kafka"] = "embedded"
    """Which log joins the components: a SQLite file in the run directory, or Apache Kafka."""
    bootstrap: str | None = None
    """Kafka bootstrap servers (``host:port``); required when ``backend`` is ``kafka``."""
    partitions: int = Field(default=2, ge=1, le=64)
    """Partitions of the tasks and trajectories topics (the most producers / processors that share work)."""
    security: KafkaSecurity = KafkaSecurity()
    """Kafka authentication and encryption, for every client of the run (confluent-kafka and faust alike)."""

    def client_config(self, component: str | None = None) -> dict[str, str]:
        """Settings every Kafka client of ``component`` adds (security; the password read now); none for PLAINTEXT."""
        if self.backend != "kafka" or self.security.protocol == "PLAINTEXT":
            return {}
        return self.security.client_config(component)

    @model_validator(mode="after")
    def _kafka_needs_bootstrap(self) -> "LogConfig":
        if self.backend == "kafka" and not self.bootstrap:
            raise ValueError("bootstrap is required when backend is 'kafka' (e.g. 127.0.0.1:9092)")
        return self
