"""``log.security``: one section gives confluent-kafka and faust (aiokafka) the same protocol, SASL
mechanism, user, password, CA and client certificate; the password is read from an environment
variable or a file when a client is made, and never written to the resolved config; the embedded
log's file is its owner's only.

The settings are checked against the client libraries themselves: librdkafka builds a client from
them (it refuses unknown keys and loads the CA file), and faust turns its credentials into the
aiokafka arguments it would connect with.
"""

from __future__ import annotations

import datetime
import stat
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from astraflow.config import KafkaSecurity, parse_config
from astraflow.config.run import dump_config
from astraflow.core.errors import ConfigError
from astraflow.log import TopicSpec, open_log

SECRET = "s3cret-not-in-any-file"


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate and its key, as PEM files (a CA for the client to trust)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "astraflow test CA")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "ca.pem", directory / "ca.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "password_env": "P"}, "needs username"),
        ({"protocol": "SASL_SSL", "username": "u", "password_env": "P"}, "needs sasl_mechanism"),
        (
            {"protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN", "username": "u"},
            "exactly one of password_env and password_file",
        ),
        (
            {
                "protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": "PLAIN",
                "username": "u",
                "password_env": "P",
                "password_file": "f",
            },
            "exactly one of password_env and password_file",
        ),
        ({"username": "u"}, "username: only with a SASL_PLAINTEXT or SASL_SSL protocol"),
        (
            {
                "protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": "PLAIN",
                "username": "u",
                "password_env": "P",
                "ca_file": "c",
            },
            "ca_file: only with an SSL or SASL_SSL protocol",
        ),
        ({"protocol": "SSL", "cert_file": "c"}, "cert_file and key_file go together"),
        ({"protocol": "SASL_SSL", "sasl_mechanism": "GSSAPI"}, "sasl_mechanism"),
    ],
)
def test_settings_that_do_not_fit_the_protocol_are_refused_by_name(settings: dict, problem: str) -> None:
    with pytest.raises(ConfigError, match=f"log.security.*{problem}"):
        parse_config({"log": {"backend": "kafka", "bootstrap": "127.0.0.1:9092", "security": settings}})


def sasl_ssl(tmp_path: Path, **password: str) -> dict:
    ca, _ = self_signed(tmp_path)
    return {
        "backend": "kafka",
        "bootstrap": "127.0.0.1:9",
        "security": {
            "protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "username": "producer",
            "ca_file": str(ca),
            **password,
        },
    }


def test_the_password_comes_from_the_environment_or_a_file_and_never_reaches_the_resolved_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = parse_config({"log": sasl_ssl(tmp_path, password_env="ASTRAFLOW_TEST_KAFKA_PASSWORD")})
    with pytest.raises(ConfigError, match="environment variable ASTRAFLOW_TEST_KAFKA_PASSWORD is not set"):
        config.log.client_config()
    monkeypatch.setenv("ASTRAFLOW_TEST_KAFKA_PASSWORD", SECRET)
    settings = config.log.client_config()
    assert settings == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "producer",
        "sasl.password": SECRET,
        "ssl.ca.location": config.log.security.ca_file,
    }
    dump_config(config, tmp_path / "config.yaml")
    written = (tmp_path / "config.yaml").read_text()
    assert SECRET not in written and "ASTRAFLOW_TEST_KAFKA_PASSWORD" in written
    assert SECRET not in repr(config)

    secret_file = tmp_path / "password"
    with pytest.raises(ConfigError, match=f"password_file: cannot read {secret_file}"):
        parse_config({"log": sasl_ssl(tmp_path, password_file=str(secret_file))}).log.client_config()
    secret_file.write_text(f"{SECRET}\n")
    from_file = parse_config({"log": sasl_ssl(tmp_path, password_file=str(secret_file))})
    assert from_file.log.client_config()["sasl.password"] == SECRET


def test_librdkafka_builds_clients_from_the_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every key is one librdkafka knows, and the CA file loads (a client is made; nothing connects)."""
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient

    monkeypatch.setenv("ASTRAFLOW_TEST_KAFKA_PASSWORD", SECRET)
    config = parse_config({"log": sasl_ssl(tmp_path, password_env="ASTRAFLOW_TEST_KAFKA_PASSWORD")})
    settings = {"bootstrap.servers": "127.0.0.1:9", **config.log.client_config()}
    Producer(settings).flush(0)
    Consumer({**settings, "group.id": "g"}).close()
    AdminClient(settings)
    (tmp_path / "not-a-ca.pem").write_text("not a certificate\n")
    from confluent_kafka import KafkaException

    with pytest.raises(KafkaException, match="ssl.ca.location"):
        Producer({**settings, "ssl.ca.location": str(tmp_path / "not-a-ca.pem")})


def test_faust_gets_the_same_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    from astraflow.streams.runtimes.faust_consumer import broker_credentials

    monkeypatch.setenv("ASTRAFLOW_TEST_KAFKA_PASSWORD", SECRET)
    ca, key = self_signed(tmp_path)
    security = KafkaSecurity(
        protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        username="stream",
        password_env="ASTRAFLOW_TEST_KAFKA_PASSWORD",
        ca_file=str(ca),
        cert_file=str(ca),
        key_file=str(key),
    )
    auth = credentials_to_aiokafka_auth(broker_credentials(security))
    assert {k: auth[k] for k in ("security_protocol", "sasl_mechanism", "sasl_plain_username")} == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "stream",
    }
    assert auth["sasl_plain_password"] == SECRET
    assert auth["ssl_context"].get_ca_certs()[0]["subject"] == ((("commonName", "astraflow test CA"),),)
    tls = credentials_to_aiokafka_auth(broker_credentials(KafkaSecurity(protocol="SSL", ca_file=str(ca))))
    assert tls["security_protocol"] == "SSL" and "sasl_mechanism" not in tls
    assert broker_credentials(KafkaSecurity()) is None


def test_the_embedded_log_file_is_its_owners_only(tmp_path: Path) -> None:
    path = tmp_path / "run" / "log.sqlite"
    with open_log("embedded", path=path) as log, log.producer() as producer:
        log.create_topic(TopicSpec("t", partitions=1))
        producer.send("t", b"x")
        producer.flush()
        files = [p for p in path.parent.iterdir() if p.name.startswith("log.sqlite")]
        assert {p.name for p in files} >= {"log.sqlite", "log.sqlite-wal"}
        assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in files} == {p.name: 0o600 for p in files}


def test_with_role_credentials_each_component_logs_in_as_its_role(tmp_path: Path) -> None:
    from astraflow.streams.runtimes.faust_consumer import broker_credentials

    credentials = tmp_path / "security"
    credentials.mkdir()
    for principal in ("admin", "feeder", "producer", "stream", "trainer", "evaluator", "scaler", "analysis"):
        (credentials / f"{principal}.password").write_text(f"pw-{principal}\n")
    security = {"protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "role_credentials": str(credentials)}
    log = parse_config({"log": {"backend": "kafka", "bootstrap": "127.0.0.1:9", "security": security}}).log
    expected = {
        "feed": "feeder",
        "rollout": "producer",
        "stream": "stream",
        "train": "trainer",
        "evaluate": "evaluator",
        "scale": "scaler",
        "analysis": "analysis",
        "launcher": "admin",
        None: "admin",
    }
    for component, principal in expected.items():
        settings = log.client_config(component)
        assert (settings["sasl.username"], settings["sasl.password"]) == (principal, f"pw-{principal}"), component
    faust = broker_credentials(log.security, "stream")
    assert (faust.username, faust.password) == ("stream", "pw-stream")
    (credentials / "trainer.password").unlink()
    with pytest.raises(ConfigError, match="role_credentials: cannot read .*trainer.password"):
        log.client_config("train")
    for wrong, problem in (
        ({**security, "username": "u"}, "username: not with role_credentials"),
        ({"role_credentials": str(credentials)}, "role_credentials: only with a SASL_PLAINTEXT or SASL_SSL protocol"),
    ):
        with pytest.raises(ConfigError, match=problem):
            parse_config({"log": {"backend": "kafka", "bootstrap": "127.0.0.1:9", "security": wrong}})


def test_a_security_file_is_a_run_config_or_the_section_alone_and_its_mistakes_are_named(tmp_path: Path) -> None:
    from astraflow.config.log import load_security, security_client_config

    section = {"protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "role_credentials": str(tmp_path)}
    (tmp_path / "analysis.password").write_text("s3cret\n")
    alone, run = tmp_path / "alone.yaml", tmp_path / "run.yaml"
    alone.write_text(yaml.safe_dump(section))
    run.write_text(yaml.safe_dump({"run": "r", "log": {"backend": "kafka", "security": section}}))
    for path in (alone, run):
        settings = security_client_config(load_security(path), "analysis")
        assert settings["sasl.username"] == "analysis" and settings["sasl.password"] == "s3cret"
    assert security_client_config(None, "analysis") == {}
    for text, named in [
        ("run: r\nlog: {backend: kafka}\n", "a run config without log.security"),
        ("- protocol\n", "expected a log.security mapping"),
        ("protocol: SASL_SSL\n", "needs sasl_mechanism and username"),
        ("protocol: SSL\nbogus: 1\n", "bogus"),
        ("protocol: [unclosed\n", "not YAML"),
    ]:
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        with pytest.raises(ConfigError, match=named):
            load_security(bad)


def test_broker_credentials_gives_a_role_a_directory_of_its_own_that_logs_in_only_that_role(tmp_path: Path) -> None:
    """``astraflow broker credentials``: a component given only its role's directory logs in as its role
    (``role_credentials`` reads ``<principal>.password`` alone); any other role's login fails naming the
    file it lacks, and no other secret of the home (passwords, CA key, node key) is in it."""
    from typer.testing import CliRunner

    from astraflow.cli import app
    from astraflow.config.log import load_security
    from astraflow.infra.broker.secure import PRINCIPALS, ROLE_SECURITY, SecurityFiles

    home = tmp_path / "home"
    files = SecurityFiles(home / "security").make()
    out = tmp_path / "feeder-only"
    done = CliRunner().invoke(app, ["broker", "credentials", "feeder", "--home", str(home), "--out", str(out)])
    assert done.exit_code == 0, done.output + repr(done.exception)
    assert sorted(path.name for path in out.iterdir()) == sorted(["feeder.password", "ca.pem", ROLE_SECURITY])
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    assert stat.S_IMODE((out / "feeder.password").stat().st_mode) == 0o600
    assert (out / "ca.pem").read_bytes() == files.ca.read_bytes()
    everything = b"".join(path.read_bytes() for path in out.iterdir())
    secrets = [files.password(p).encode() for p in PRINCIPALS if p != "feeder"] + [files.ca_key.read_bytes()]
    assert not any(secret in everything for secret in secrets)

    security = load_security(out / ROLE_SECURITY)
    assert security.client_config("feed")["sasl.password"] == files.password("feeder")
    assert security.client_config("feed")["ssl.ca.location"] == str(out.resolve() / "ca.pem")
    for component, principal in (("train", "trainer"), ("rollout", "producer"), (None, "admin")):
        with pytest.raises(ConfigError, match=f"cannot read .*feeder-only/{principal}.password"):
            security.client_config(component)

    mounted = CliRunner().invoke(
        app, ["broker", "credentials", "feeder", "--home", str(home), "--out", str(out), "--mount", "/security"]
    )
    assert mounted.exit_code == 0 and load_security(out / ROLE_SECURITY).role_credentials == "/security"
    for args, problem in (
        (["trainer", "--out", str(out)], "holds feeder.password: a role's directory must hold its own password only"),
        (["nobody", "--out", str(tmp_path / "x")], "no principal 'nobody'"),
        (["feeder", "--out", str(files.directory)], "is the broker's security directory"),
    ):
        refused = CliRunner().invoke(app, ["broker", "credentials", *args, "--home", str(home)])
        assert refused.exit_code != 0 and problem in str(refused.exception), (args, refused.exception)
    missing = CliRunner().invoke(
        app, ["broker", "credentials", "feeder", "--home", str(tmp_path / "none"), "--out", str(tmp_path / "y")]
    )
    assert "no secure broker made" in str(missing.exception)
