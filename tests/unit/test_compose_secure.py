"""docker-compose.secure.yml: the compose stack with the cluster of ``astraflow broker start --secure``.

Without a Docker engine: ``docker compose config`` (or the older ``docker-compose config``) merges
the two files as ``up`` would, and the merged stack is checked - loopback-only ports, nodes started
from the generated ``server.properties``, components logged in by role. ``astraflow broker
secure-config``, the one shot that generates those files, is run here as the stack runs it, and its
node settings are compared with those the local secure broker writes. Neither compose being
installed skips the merge checks, except under ``CI=true``, where it fails (scripts/ensure-system.sh
installs one). tests/integration/test_secure_config_broker.py starts a real node from the output.
"""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from astraflow.cli import app
from astraflow.config.log import COMPONENT_ROLES, load_security
from astraflow.infra.broker.container import ADMIN_CLIENT, FORMAT_ARGS, LOG_SECURITY, PROPERTIES
from astraflow.infra.broker.local import LocalKafkaBroker
from astraflow.infra.broker.secure import PRINCIPALS, SecurityFiles
from tests._broker import unavailable

REPO = Path(__file__).resolve().parents[2]
FILES = ["docker-compose.yml", "docker-compose.secure.yml"]
BASE = yaml.safe_load((REPO / FILES[0]).read_text())["services"]
SECURE = yaml.safe_load((REPO / FILES[1]).read_text())["services"]
NODES = ["kafka", "kafka-2", "kafka-3"]
COMPONENTS = ["feed", "rollout", "stream", "train", "evaluate"]
VOLUME = "/security"
SECURITY_ARG = ["--security", f"{VOLUME}/{LOG_SECURITY}"]


def compose_command() -> list[str]:
    """``docker compose`` (the plugin) or else ``docker-compose``: either merges files without an engine."""
    for command in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(command[0]) is None:
            continue
        try:
            if subprocess.run([*command, "version"], capture_output=True, timeout=60).returncode == 0:
                return command
        except (OSError, subprocess.TimeoutExpired):
            continue
    unavailable("neither `docker compose` nor `docker-compose` is installed (scripts/ensure-system.sh installs one)")


@pytest.fixture(scope="module")
def merged() -> dict[str, dict]:
    """The services of both files merged by compose itself (``config``: parsing and merging only)."""
    command = [*compose_command(), *(arg for name in FILES for arg in ("-f", name)), "config"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stderr}"
    return yaml.safe_load(done.stdout)["services"]


def published(port: object) -> tuple[str, int, int]:
    """(host address, host port, container port) of a ``ports`` entry in either compose's output."""
    if isinstance(port, dict):  # docker compose: the long syntax
        return port.get("host_ip", ""), int(port["published"]), int(port["target"])
    host, host_port, target = str(port).split("/")[0].rsplit(":", 2)
    return host, int(host_port), int(target)


def mounts(service: dict) -> dict[str, tuple[str, bool]]:
    """Container path -> (volume, read only) of a service's volumes in either compose's output."""
    found = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            found[volume["target"]] = (volume["source"], bool(volume.get("read_only")))
        else:
            source, target, *mode = volume.split(":")
            found[target] = (source, mode == ["ro"])
    return found


def enabled(services: dict[str, dict]) -> dict[str, dict]:
    """The services ``up`` starts without ``--profile`` (docker compose leaves the others out already)."""
    return {name: service for name, service in services.items() if not service.get("profiles")}


def test_every_published_port_binds_loopback_only(merged: dict[str, dict]) -> None:
    ports = [(name, published(port)) for name, service in merged.items() for port in service.get("ports", [])]
    assert ports
    assert [(name, port) for name, port in ports if port[0] != "127.0.0.1"] == []


@pytest.mark.parametrize("node", NODES)
def test_kafka_nodes_format_with_scram_and_start_from_the_generated_properties(
    merged: dict[str, dict], node: str
) -> None:
    service = merged[node]
    assert service["command"] == [f"{VOLUME}/{node}/{PROPERTIES}"]
    script = " ".join(service["entrypoint"])
    for part in ("kafka-storage.sh format", "--ignore-formatted", f"{VOLUME}/{FORMAT_ARGS}", "kafka-server-start.sh"):
        assert part in script, f"{node}: the entrypoint lacks {part!r}"
    assert service["depends_on"]["security"]["condition"] == "service_completed_successfully"
    volumes = mounts(service)
    assert volumes[VOLUME] == ("security", True)
    data = volumes["/var/lib/kafka/data"][0]
    assert data != mounts(BASE[node])["/var/lib/kafka/data"][0], "a plain cluster's storage has no SCRAM users"
    assert f"--command-config {VOLUME}/{ADMIN_CLIENT}" in " ".join(service["healthcheck"]["test"])


def test_the_host_listener_is_the_published_port(merged: dict[str, dict]) -> None:
    """Each node advertises to the host the port compose publishes for it, on the container port it maps."""
    options = options_of(merged["security"]["command"])
    external = options["--external"].split(",")
    assert options["--hosts"].split(",") == NODES == [merged[node]["hostname"] for node in NODES]
    for node, address in zip(NODES, external):
        ((host, host_port, target),) = [published(port) for port in merged[node]["ports"]]
        assert address == f"localhost:{host_port}" and target == int(options.get("--external-port", 9094))


def test_the_security_one_shot_writes_the_volume_offline(merged: dict[str, dict]) -> None:
    service = merged["security"]
    assert service["command"][:2] == ["broker", "secure-config"]
    assert options_of(service["command"])["--out"] == VOLUME
    assert mounts(service)[VOLUME] == ("security", False)
    assert service.get("network_mode") == "none" and service["restart"] == "no"


@pytest.mark.parametrize("component", COMPONENTS)
def test_components_log_in_by_role_after_the_grant(merged: dict[str, dict], component: str) -> None:
    service = merged[component]
    assert service["command"] == BASE[component]["command"] + SECURITY_ARG
    assert service["depends_on"]["grant"]["condition"] == "service_completed_successfully"
    assert mounts(service)[VOLUME] == (f"security-{COMPONENT_ROLES[component]}", True)  # its role's secrets alone
    assert "security" not in {volume for volume, _ in mounts(service).values()}


def test_the_grant_runs_as_admin_once_the_nodes_are_healthy(merged: dict[str, dict]) -> None:
    service = merged["grant"]
    config = BASE["feed"]["command"][1]
    assert service["command"][:3] == ["broker", "grant", config]
    options = options_of(service["command"][3:])
    assert options["--bootstrap"] == options_of(BASE["feed"]["command"][2:])["--bootstrap"]
    assert options["--security"] == SECURITY_ARG[1]
    assert all(service["depends_on"][node]["condition"] == "service_healthy" for node in NODES)


def test_kafka_ui_is_not_started(merged: dict[str, dict]) -> None:
    """It has no login: as admin it would hand every local user the admin's rights."""
    assert "kafka-ui" not in enabled(merged)


def test_the_override_commands_are_cli_commands() -> None:
    """What the one shots and components run exists, with every option they pass."""
    import typer.main

    root = typer.main.get_command(app)
    for name, service in SECURE.items():
        if "command" not in service or name in NODES:
            continue
        command, words = root, list(service["command"])
        while hasattr(command, "commands") and words and words[0] in command.commands:
            command = command.commands[words.pop(0)]
        accepted = {opt for param in command.params for opt in param.opts}
        given = {word for word in words if word.startswith("--")}
        assert given <= accepted, f"{name}: `astraflow {' '.join(service['command'][:2])}` lacks {given - accepted}"


def test_no_secret_is_committed() -> None:
    text = (REPO / FILES[1]).read_text().lower()
    assert "password=" not in text and "password:" not in text and "jaas" not in text


def options_of(words: list[str]) -> dict[str, str]:
    """``--option value`` pairs of a command (flags without a value are not used here)."""
    return {word: words[i + 1] for i, word in enumerate(words[:-1]) if word.startswith("--")}


# --- astraflow broker secure-config, as the stack runs it ---


def generate(out: Path, *extra: str) -> SecurityFiles:
    """Run the security one shot's command (``--out`` here, ``--owner`` left out: it needs root)."""
    options = options_of(SECURE["security"]["command"])
    args = ["broker", "secure-config", "--out", str(out), "--hosts", options["--hosts"]]
    args += ["--external", options["--external"], *extra]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    return SecurityFiles(out)


def read_properties(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if line and not line.startswith("#"))


ADDRESSES = {"listeners", "advertised.listeners", "controller.quorum.voters", "log.dirs", "node.id"}
"""The settings that name a node's addresses or place: the only ones a container node may differ in."""
PROTOCOLS = "listener.security.protocol.map"
"""The same as the local broker's, plus the host listener's."""


def test_nodes_get_the_settings_of_the_local_secure_broker(tmp_path: Path) -> None:
    files = generate(tmp_path / "security")
    local = LocalKafkaBroker(tmp_path / "home", 9092, 9093, internal_port=9091, replicas=3, security=files)
    local.home.mkdir()
    expected = read_properties(local._write_config())
    for n, node in enumerate(NODES, start=1):
        written = read_properties(files.directory / node / PROPERTIES)
        same = {key: value for key, value in expected.items() if key not in ADDRESSES | {PROTOCOLS}}
        assert {key: written.get(key) for key in same} == same, node
        assert set(written) - set(expected) == {  # the host listener: SASL_SSL, like the client port
            "listener.name.host.sasl.enabled.mechanisms",
            "listener.name.host.scram-sha-512.sasl.jaas.config",
        }
        assert written[PROTOCOLS] == expected[PROTOCOLS] + ",HOST:SASL_SSL"
        assert written["node.id"] == str(n)
        assert written["controller.quorum.voters"] == ",".join(f"{i}@{h}:9093" for i, h in enumerate(NODES, start=1))
        assert written["advertised.listeners"] == (
            f"SASL_SSL://{node}:9092,INTERNAL://{node}:9091,HOST://localhost:{9093 + n}"
        )
        assert written["listeners"].startswith("SASL_SSL://0.0.0.0:9092,INTERNAL://0.0.0.0:9091,CONTROLLER://")
        assert "PLAINTEXT" not in written["listeners"] + written["listener.security.protocol.map"]


def test_the_certificate_names_every_host_and_is_signed_by_the_ca(tmp_path: Path) -> None:
    from cryptography import x509

    files = generate(tmp_path / "security")
    assert set(NODES) | {"localhost", "127.0.0.1"} <= files.node_hosts()
    ca = x509.load_pem_x509_certificate(files.ca.read_bytes())
    x509.load_pem_x509_certificates(files.node.read_bytes())[0].verify_directly_issued_by(ca)


def test_secrets_are_private_and_only_where_they_must_be(tmp_path: Path) -> None:
    files = generate(tmp_path / "security")
    assert stat.S_IMODE(files.directory.stat().st_mode) == 0o700
    private = [files.ca_key, files.node, files.directory / FORMAT_ARGS, files.directory / ADMIN_CLIENT]
    for path in private + [files.password_file(principal) for principal in PRINCIPALS]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    passwords = [files.password(principal) for principal in PRINCIPALS]
    public = [files.directory / LOG_SECURITY, *(files.directory / node / PROPERTIES for node in NODES)]
    for path in public:
        assert not any(password in path.read_text() for password in passwords), f"{path} holds a password"
    assert all(password in (files.directory / FORMAT_ARGS).read_text() for password in passwords)
    assert passwords[0] in (files.directory / ADMIN_CLIENT).read_text()  # admin, for the healthcheck


def test_the_format_arguments_are_the_scram_credentials_one_a_line(tmp_path: Path) -> None:
    files = generate(tmp_path / "security")
    assert (files.directory / FORMAT_ARGS).read_text().splitlines() == files.scram_arguments()


def test_the_services_log_security_logs_each_component_in_as_its_role(tmp_path: Path) -> None:
    files = generate(tmp_path / "security")
    security = load_security(files.directory / LOG_SECURITY)
    assert security.role_credentials == str(files.directory) and security.ca_file == str(files.ca)
    feeder = security.client_config("feed")
    assert (feeder["sasl.username"], feeder["sasl.password"]) == ("feeder", files.password("feeder"))
    assert security.client_config()["sasl.username"] == "admin"


def test_a_rerun_keeps_the_ca_and_passwords_and_reissues_for_new_hosts(tmp_path: Path) -> None:
    files = generate(tmp_path / "security")
    ca, password = files.ca.read_bytes(), files.password("trainer")
    again = generate(tmp_path / "security", "--external", "localhost:1,localhost:2,node.example:3")
    assert (again.ca.read_bytes(), again.password("trainer")) == (ca, password)
    assert "node.example" in again.node_hosts()


def test_owner_hands_every_file_over(tmp_path: Path) -> None:
    import os

    files = generate(tmp_path / "security", "--owner", f"{os.getuid()}:{os.getgid()}")
    assert {path.stat().st_uid for path in files.directory.rglob("*")} == {os.getuid()}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hosts", "a,b", "--external", "localhost:1"], "--external: 1 addresses for 2 hosts"),
        (["--hosts", "a,a"], "a host is named twice"),
        (["--hosts", "a", "--external", "localhost"], "'localhost' is not host:port"),
        (["--hosts", "a", "--owner", "appuser"], "--owner: 'appuser' is not UID:GID"),
    ],
)
def test_bad_options_are_named(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["broker", "secure-config", "--out", str(tmp_path / "s"), *args])
    assert result.exit_code != 0 and message in str(result.exception)


def test_components_take_log_security_from_security(tmp_path: Path) -> None:
    from astraflow.cli.components import _component

    files = generate(tmp_path / "security")
    config, _ = _component(
        REPO / "examples/math/config.yaml", None, "kafka", "kafka:9092", security=files.directory / LOG_SECURITY
    )
    assert config.log.security.role_credentials == str(files.directory)
    assert config.log.client_config("train")["sasl.username"] == "trainer"


def test_grant_by_bootstrap_needs_sasl_and_no_home(tmp_path: Path) -> None:
    config = str(REPO / "examples/math/config.yaml")
    plain = tmp_path / "plain.yaml"
    plain.write_text("protocol: PLAINTEXT\n")
    refused = CliRunner().invoke(app, ["broker", "grant", config, "--bootstrap", "b:1", "--security", str(plain)])
    assert "ACLs need SASL principals" in str(refused.exception)
    both = CliRunner().invoke(app, ["broker", "grant", config, "--bootstrap", "b:1", "--home", str(tmp_path)])
    assert "--home and --bootstrap" in str(both.exception)
