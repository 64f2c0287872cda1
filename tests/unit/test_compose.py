"""docker-compose.yml and the Dockerfile stay in step with the CLI, the examples and uv.lock.

Read as plain YAML and text, so no Docker engine is needed: a renamed subcommand, a moved example
config or a Kafka setting that drops KRaft fails here rather than at ``docker compose up``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES: dict[str, dict] = COMPOSE["services"]
DOCKERFILE = (REPO / "Dockerfile").read_text()
KAFKA_IMAGE = "${ASTRAFLOW_KAFKA_IMAGE:-apache/kafka:4.1.1}"
"""apache/kafka, unless scripts/stack.sh names the Kafka image it built (deploy/stack/Dockerfile.kafka)."""

COMPONENTS = ["warmup", "feed", "rollout", "stream", "train", "evaluate"]
ASTRAFLOW_SERVICES = sorted(name for name, service in SERVICES.items() if "build" in service)


@pytest.fixture(scope="module")
def subcommands() -> dict[str, object]:
    """The click commands behind ``astraflow <name>``, by name."""
    import typer.main

    from astraflow.cli import app

    return dict(typer.main.get_command(app).commands)


def test_subcommands_are_read_from_the_typer_app(subcommands: dict[str, object]) -> None:
    assert "broker" in subcommands


def test_every_component_has_a_service() -> None:
    assert set(COMPONENTS) <= set(ASTRAFLOW_SERVICES)


KAFKA_NODES = ["kafka", "kafka-2", "kafka-3"]
BOOTSTRAP = "kafka:9092,kafka-2:9092,kafka-3:9092"


@pytest.mark.parametrize("name", KAFKA_NODES)
def test_kafka_runs_three_kraft_nodes_with_three_replicas_two_in_sync(name: str) -> None:
    kafka = SERVICES[name]
    env = {key: str(value) for key, value in kafka["environment"].items()}
    assert kafka["image"] == KAFKA_IMAGE
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert not any("ZOOKEEPER" in key for key in env)
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    assert env["KAFKA_NODE_ID"] == str(KAFKA_NODES.index(name) + 1)
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == "1@kafka:9093,2@kafka-2:9093,3@kafka-3:9093"
    assert f"PLAINTEXT://{name}:9092" in env["KAFKA_ADVERTISED_LISTENERS"]
    assert f"localhost:{9094 + KAFKA_NODES.index(name)}" in env["KAFKA_ADVERTISED_LISTENERS"]
    replication = {key: value for key, value in env.items() if "REPLICATION_FACTOR" in key}
    assert replication and set(replication.values()) == {"3"}
    in_sync = {key: value for key, value in env.items() if "MIN_ISR" in key or "MIN_INSYNC" in key}
    assert in_sync and set(in_sync.values()) == {"2"}
    assert "healthcheck" in kafka


def test_kafka_internal_topics_are_sized_for_a_container_of_1024_open_files() -> None:
    env = SERVICES["kafka"]["environment"]
    sized = {key: int(value) for key, value in env.items() if key.endswith("_NUM_PARTITIONS")}
    assert set(sized) == {
        "KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS",
        "KAFKA_TRANSACTION_STATE_LOG_NUM_PARTITIONS",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_NUM_PARTITIONS",
    }
    assert max(sized.values()) <= 10


def test_every_kafka_image_of_the_stack_can_be_the_locally_built_one() -> None:
    secure = yaml.safe_load((REPO / "docker-compose.secure.yml").read_text())["services"]
    images = {name: service["image"] for name, service in [*SERVICES.items(), *secure.items()] if "image" in service}
    kafka = {name for name, image in images.items() if "kafka:" in image and "kafka-ui" not in image}
    assert kafka >= {*KAFKA_NODES, "kafka-remote", "mirror-maker", "quotas"}
    assert {images[name] for name in kafka} == {KAFKA_IMAGE}


def test_the_kafka_image_has_every_tool_the_compose_files_call() -> None:
    """A script of Kafka's bin/ named in a compose file is a link to kafka-tool in the stack's Kafka image."""
    compose = (REPO / "docker-compose.yml").read_text() + (REPO / "docker-compose.secure.yml").read_text()
    called = set(re.findall(r"/opt/kafka/bin/([\w-]+\.sh)", compose))
    assert {"kafka-broker-api-versions.sh", "kafka-storage.sh", "kafka-server-start.sh"} <= called
    tool = (REPO / "deploy" / "stack" / "kafka" / "kafka-tool").read_text()
    linked = (REPO / "deploy" / "stack" / "Dockerfile.kafka").read_text()
    assert {name for name in called if f"{name})" not in tool} == set()
    assert {name for name in called if name not in linked} == set()


def test_the_compose_tool_is_pinned() -> None:
    lines = (REPO / "deploy" / "stack" / "compose-requirements.txt").read_text().splitlines()
    pins = [line for line in lines if line and not line.startswith("#")]
    assert any(pin.startswith("podman-compose==") for pin in pins)
    assert all(re.fullmatch(r"[\w.-]+==[\w.]+", pin) for pin in pins), pins


def test_kafka_ui_points_at_the_broker() -> None:
    ui = SERVICES["kafka-ui"]
    assert ui["image"].startswith("provectuslabs/kafka-ui")
    assert ui["environment"]["KAFKA_CLUSTERS_0_BOOTSTRAPSERVERS"] == BOOTSTRAP


@pytest.mark.parametrize("service", ASTRAFLOW_SERVICES)
def test_service_command_is_a_cli_subcommand(service: str, subcommands: dict[str, object]) -> None:
    command = SERVICES[service]["command"]
    assert command[0] in subcommands, f"{service}: `astraflow {command[0]}` is not a subcommand"
    accepted = {opt for param in subcommands[command[0]].params for opt in param.opts}
    given = {word for word in command[1:] if word.startswith("--")}
    assert given <= accepted, f"{service}: `astraflow {command[0]}` has no option {sorted(given - accepted)}"


@pytest.mark.parametrize("service", ASTRAFLOW_SERVICES)
def test_service_config_is_in_the_repo_and_the_image(service: str) -> None:
    config = Path(SERVICES[service]["command"][1])
    assert not config.is_absolute()
    assert (REPO / config).is_file(), f"{service}: {config} does not exist"
    assert f"COPY {config.parts[0]} " in DOCKERFILE, f"{service}: the image lacks {config.parts[0]}/"


def test_services_share_one_run_dir_on_the_runs_volume() -> None:
    run_dirs = set()
    for service in ASTRAFLOW_SERVICES:
        command = SERVICES[service]["command"]
        run_dirs.add(dict(zip(command[2::2], command[3::2]))["--run-dir"])
        assert "runs:/runs" in SERVICES[service]["volumes"], service
    assert len(run_dirs) == 1 and run_dirs.pop().startswith("/runs/")


@pytest.mark.parametrize("service", sorted(set(ASTRAFLOW_SERVICES) - {"warmup"}))
def test_component_uses_the_kafka_log(service: str) -> None:
    command = SERVICES[service]["command"]
    options = dict(zip(command[2::2], command[3::2]))
    assert options["--backend"] == "kafka"
    assert options["--bootstrap"] == BOOTSTRAP


@pytest.mark.parametrize("service", sorted(set(ASTRAFLOW_SERVICES) - {"warmup"}))
def test_component_starts_after_kafka_and_warmup(service: str) -> None:
    depends_on = SERVICES[service]["depends_on"]
    assert all(depends_on[node]["condition"] == "service_healthy" for node in KAFKA_NODES)
    assert depends_on["warmup"]["condition"] == "service_completed_successfully"


def test_warmup_is_one_shot_and_rollout_scales() -> None:
    assert SERVICES["warmup"]["restart"] == "no"
    rollout = SERVICES["rollout"]
    assert rollout["deploy"]["replicas"] >= 1
    assert rollout["deploy"]["mode"] == "replicated", "podman-compose counts the replicas only in this mode"
    assert "container_name" not in rollout, "a fixed container name forbids --scale rollout=N"


def test_dockerfile_installs_the_locked_package() -> None:
    # the public images by default; scripts/stack.sh passes images it built instead
    assert "ARG PYTHON_IMAGE=python:3.11-slim" in DOCKERFILE and "FROM ${PYTHON_IMAGE}" in DOCKERFILE
    assert "ARG UV_IMAGE=ghcr.io/astral-sh/uv:${UV_VERSION}" in DOCKERFILE and "FROM ${UV_IMAGE} AS uv" in DOCKERFILE
    assert "uv.lock" in DOCKERFILE
    assert "uv sync --frozen" in DOCKERFILE
    assert 'ENTRYPOINT ["astraflow"]' in DOCKERFILE
    ignored = (REPO / ".dockerignore").read_text().split()
    assert not {"uv.lock", "pyproject.toml", "astraflow", "examples"} & set(ignored)


def test_no_port_is_published_beyond_loopback() -> None:
    """The stack runs PLAINTEXT Kafka and a Kafka UI without login: reachable from this machine only."""
    published = [(name, port) for name, service in SERVICES.items() for port in service.get("ports", [])]
    assert published
    assert [(name, port) for name, port in published if not str(port).startswith("127.0.0.1:")] == []


# --- docker-compose.secure.yml: which service can read which secret ---

SECURE: dict[str, dict] = yaml.safe_load((REPO / "docker-compose.secure.yml").read_text())["services"]
ALL_SECRETS = "security"
"""The volume with every password, the CA key and the node key."""
TRUSTED = {"security", "kafka", "kafka-2", "kafka-3", "quotas"}
"""What may mount it: the one shot that writes it, the nodes (their key, the format's SCRAM credentials) and
the quotas one shot (Kafka's tools as admin)."""
ROLE_OF = {"grant": "admin", "analysis": "analysis"}
"""Services that are not components, by the principal they log in as."""


def secure_mounts(name: str) -> dict[str, tuple[str, bool]]:
    """Container path -> (volume, read only) of a service of the secure stack: the plain file's volumes with
    the secure file's over them (compose merges a service's volumes by container path)."""
    found = {}
    for volume in [*SERVICES.get(name, {}).get("volumes", []), *SECURE.get(name, {}).get("volumes", [])]:
        source, target, *mode = volume.split(":")
        found[target] = (source, mode == ["ro"])
    return found


def secret_volumes(name: str) -> dict[str, str]:
    """Volume -> container path of the secret volumes (``security``, ``security-<principal>``) a service mounts."""
    return {source: target for target, (source, _) in secure_mounts(name).items() if source.startswith(ALL_SECRETS)}


def secure_options(words: list[str]) -> dict[str, str]:
    return {word: words[i + 1] for i, word in enumerate(words[:-1]) if word.startswith("--")}


def test_every_secure_service_is_known() -> None:
    """A service added to the secure stack is placed here: trusted with every secret, or a principal's."""
    from astraflow.config.log import COMPONENT_ROLES

    running = set(SERVICES) | set(SECURE)
    unplaced = {
        name for name in running if secret_volumes(name) and name not in TRUSTED | set(ROLE_OF) | set(COMPONENT_ROLES)
    }
    assert unplaced == set()


@pytest.mark.parametrize("service", ["feed", "rollout", "stream", "train", "evaluate", "grant", "analysis"])
def test_a_secure_service_mounts_its_own_principals_secrets_only_read_only(service: str) -> None:
    from astraflow.config.log import COMPONENT_ROLES

    principal = ROLE_OF.get(service) or COMPONENT_ROLES[service]
    assert secret_volumes(service) == {f"security-{principal}": "/security"}
    assert secure_mounts(service)["/security"] == (f"security-{principal}", True)
    if "command" in SECURE[service]:
        assert secure_options(SECURE[service]["command"])["--security"] == "/security/log-security.yaml"


def test_only_the_trusted_services_mount_every_secret_and_each_role_volume_has_one_principal() -> None:
    from astraflow.config.log import COMPONENT_ROLES

    services = set(SERVICES) | set(SECURE)
    assert {name for name in services if ALL_SECRETS in secret_volumes(name)} == TRUSTED
    for name in services - {"security"}:
        assert len(secret_volumes(name)) <= 1, f"{name} mounts the secrets of several principals"
    readers: dict[str, set[str]] = {}
    for name in services - TRUSTED:
        for volume in secret_volumes(name):
            readers.setdefault(volume, set()).add(ROLE_OF.get(name) or COMPONENT_ROLES[name])
    assert all(len(principals) == 1 for principals in readers.values()), readers


def test_the_security_one_shot_fills_each_role_volume_for_the_mount_the_services_use() -> None:
    from astraflow.infra.broker.secure import PRINCIPALS

    service = SECURE["security"]
    options = secure_options(service["command"])
    roles = options["--roles"].split(",")
    assert set(roles) <= set(PRINCIPALS)
    written = {source: target for source, target in secret_volumes("security").items() if source != ALL_SECRETS}
    assert written == {f"security-{role}": f"{options['--roles-out']}/{role}" for role in roles}
    assert options["--role-mount"] == "/security"
    assert not any(read_only for _, read_only in secure_mounts("security").values())
    declared = set(yaml.safe_load((REPO / "docker-compose.secure.yml").read_text())["volumes"])
    assert set(written) <= declared
    mounted = {volume for name in set(SECURE) - {"security"} for volume in secret_volumes(name)} - {ALL_SECRETS}
    assert mounted <= set(written), f"mounted but never written: {mounted - set(written)}"


def test_the_security_one_shot_writes_a_directory_per_role_with_that_roles_password_alone(tmp_path: Path) -> None:
    import stat

    from typer.testing import CliRunner

    from astraflow.cli import app
    from astraflow.config.log import load_security
    from astraflow.infra.broker.secure import PRINCIPALS, ROLE_SECURITY, SecurityFiles

    words = SECURE["security"]["command"]
    options = secure_options(words)
    given = {"--out": str(tmp_path / "security"), "--roles-out": str(tmp_path / "roles")}
    # into tmp_path, not the volumes' paths; without --owner, which needs root
    args = [given[words[i - 1]] if i and words[i - 1] in given else word for i, word in enumerate(words)]
    args = [word for i, word in enumerate(args) if "--owner" not in (word, args[i - 1] if i else "")]
    assert all(str(tmp_path) in args[args.index(option) + 1] for option in given)
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output + repr(done.exception)
    files = SecurityFiles(tmp_path / "security")
    for role in options["--roles"].split(","):
        directory = tmp_path / "roles" / role
        assert sorted(path.name for path in directory.iterdir()) == sorted(
            [f"{role}.password", "ca.pem", ROLE_SECURITY]
        )
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
        assert stat.S_IMODE((directory / f"{role}.password").stat().st_mode) == 0o600
        assert (directory / f"{role}.password").read_text().strip() == files.password(role)
        others = [files.password(p) for p in PRINCIPALS if p != role]
        assert not any(secret in path.read_text() for path in directory.iterdir() for secret in others)
        security = load_security(directory / ROLE_SECURITY)
        assert security.role_credentials == "/security" and security.ca_file == "/security/ca.pem"


def test_the_quotas_one_shot_gives_each_role_its_defaults_once_the_nodes_are_healthy() -> None:
    from astraflow.infra.broker.acls import DEFAULT_QUOTAS, QUOTAS_FILE, parse_quota, quota_lines

    quotas = SECURE["quotas"]
    assert quotas["image"] == SECURE.get("kafka", {}).get("image", SERVICES["kafka"]["image"])
    script = " ".join(quotas["entrypoint"])
    for part in (f"/security/{QUOTAS_FILE}", "--command-config /security/admin-client.properties", "--add-config"):
        assert part in script
    assert all(quotas["depends_on"][node]["condition"] == "service_healthy" for node in KAFKA_NODES)
    for component in ["feed", "rollout", "stream", "train", "evaluate"]:
        assert SECURE[component]["depends_on"]["quotas"]["condition"] == "service_completed_successfully"
    lines = quota_lines(DEFAULT_QUOTAS).splitlines()  # what the script reads: `PRINCIPAL key=value,...`
    parsed = [parse_quota(":".join(line.split(" ", 1))) for line in lines]
    assert {principal: quota for change in parsed for principal, quota in change.items()} == DEFAULT_QUOTAS
