"""docker-compose.yml and the Dockerfile stay in step with the CLI, the examples and uv.lock.

Read as plain YAML and text, so no Docker engine is needed: a renamed subcommand, a moved example
config or a Kafka setting that drops KRaft fails here rather than at ``docker compose up``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES: dict[str, dict] = COMPOSE["services"]
DOCKERFILE = (REPO / "Dockerfile").read_text()

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
    assert kafka["image"].startswith("apache/kafka:")
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
    assert "container_name" not in rollout, "a fixed container name forbids --scale rollout=N"


def test_dockerfile_installs_the_locked_package() -> None:
    assert "FROM python:3.11-slim" in DOCKERFILE
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
