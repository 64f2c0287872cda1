"""The math example on the secure dev broker, every component under its own principal.

``astraflow broker start --secure`` in a temporary home; the run's ``log.security`` names the
broker's ``security/`` folder as ``role_credentials``, so the launcher logs in as ``admin`` (makes
the topics, writes the schemas, grants each role its ACLs) and each component as its role (the
feeder as ``feeder``, the rollout producer as ``producer`` ...), which may do only what
``astraflow/infra/broker/acls.py`` grants. The run must go through versions on both stream runtimes with no
component refused anything, and the records show the producers sampled the published versions.

While it runs, the producer principal forges what steers it - the evaluator's ``eval.accuracy`` 1.0,
the trainer's ``train.version`` 1e6, the scaler's ``scaler.desired_producers`` and a dead letter
naming a trajectory - on the only control topics it may write, its own: the run still stops on its
own rule with the genuine figures, and counts each forgery (``runtime/control.py``). The stream checks
every genuine trajectory against its issued task (``stream.verify_tasks``, on by default here) and
refuses none.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from astraflow.config import parse_config
from astraflow.infra.broker.local import free_port
from astraflow.log import TopicPartition, open_log
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import Trajectory
from tests.e2e.conftest import ASTRAFLOW, write_config
from tests.integration.test_broker_lifecycle import jar_cache  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.e2e, pytest.mark.kafka, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def secure_bootstrap(jar_cache: Path, tmp_path_factory: pytest.TempPathFactory):  # noqa: F811
    home, port = tmp_path_factory.mktemp("secure-run") / "broker", free_port()
    started = subprocess.run(
        [str(ASTRAFLOW), "broker", "start", "--secure", "--home", str(home), "--port", str(port)]
        + ["--jars", str(jar_cache)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        yield f"127.0.0.1:{port}", home / "security"
    finally:
        subprocess.run([str(ASTRAFLOW), "broker", "stop", "--home", str(home)], capture_output=True, timeout=120)


def forge_as_producer(bootstrap: str, security: dict, run: str, timeout: float = 300.0) -> None:
    """Write, as the producer principal, forged control records on its own topics, once the launcher
    has made them and granted the producer its writes (until then the broker refuses: retried)."""
    import time

    from astraflow.core.errors import LogError
    from astraflow.schemas.records import DeadLetter, Metric

    codec, now = Codec(), int(time.time() * 1000)
    letter = DeadLetter("rollout-x", "forged", "", f"{run}.trajectories.main", 0, 0, None, b"", now)
    forged = [
        (f"{run}.metrics.producer", Metric("rollout-x", "eval.accuracy", 1.0, 1, now, {"policy": "main"})),
        (f"{run}.metrics.producer", Metric("rollout-x", "train.version", 1e6, 1_000_000, now, {"policy": "main"})),
        (f"{run}.metrics.producer", Metric("rollout-x", "scaler.desired_producers", 8, 1, now)),
        (f"{run}.deadletter.producer", letter),
    ]
    config = reader_config(bootstrap, security).log.client_config("rollout")
    deadline = time.monotonic() + timeout
    with open_log("kafka", bootstrap=bootstrap, client_config=config) as log:
        for topic, record in forged:
            while True:
                try:
                    with log.producer() as producer:
                        producer.send(topic, codec.encode(record), partition=0)
                        producer.flush()
                    break
                except LogError:  # the topic or the producer's grant is not there yet
                    assert time.monotonic() < deadline, f"could not write {topic} as the producer"
                    time.sleep(1.0)


def reader_config(bootstrap: str, security: dict):
    return parse_config({"log": {"backend": "kafka", "bootstrap": bootstrap, "security": security}})


def acls_on(bootstrap: str, admin: dict, topic: str) -> set[tuple[str, str]]:
    """(principal, operation) of every ACL on ``topic``, read as the admin."""
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    client = AdminClient({"bootstrap.servers": bootstrap, **admin})
    wanted = AclBindingFilter(
        ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, None, None, AclOperation.ANY, AclPermissionType.ANY
    )
    return {(acl.principal, acl.operation.name) for acl in client.describe_acls(wanted).result(timeout=30)}


@pytest.mark.parametrize("runtime", ["faust", "native"])
def test_the_math_example_runs_with_a_principal_per_component(
    secure_bootstrap: tuple[str, Path], run_dir: Path, runtime: str
) -> None:
    bootstrap, credentials = secure_bootstrap
    run = f"secure{runtime}"
    security = {
        "protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "role_credentials": str(credentials),
        "ca_file": str(credentials / "ca.pem"),
    }
    config = write_config(
        run_dir / "test.yaml",
        run=run,
        log={"backend": "kafka", "bootstrap": bootstrap, "security": security},
        stream={"runtime": runtime},
        stop={"max_versions": 4, "max_minutes": 6},
    )
    launcher = subprocess.Popen(
        [str(ASTRAFLOW), "run", str(config), "--run-dir", str(run_dir), "--no-dashboard"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        forge_as_producer(bootstrap, security, run)
        stdout, stderr = launcher.communicate(timeout=900)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    logs = "".join(path.read_text(errors="replace") for path in (run_dir / "logs").glob("*"))
    assert launcher.returncode == 0, stdout[-2000:] + stderr[-3000:] + logs[-3000:]
    assert "may not" not in logs and "authorization failed" not in logs.lower(), logs[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert 4 <= summary["versions"] < 100 and summary["backend"] == "kafka"
    assert summary["forgeries"] == {"metrics": 3, "dead_letters": 1}
    assert summary["final_accuracy"] < 1.0 and "1.000" not in stdout  # the forged accuracy ended nothing
    assert "was never issued" not in logs and "not the prompt of task" not in logs  # every genuine one passed
    # the launcher, as admin, granted the run's roles their ACLs (the components' principals are the
    # roles: tests/unit/test_log_security.py), e.g. the producer's WRITE on the trajectories
    admin = reader_config(bootstrap, security).log.client_config()
    assert ("User:producer", "WRITE") in acls_on(bootstrap, admin, f"{run}.trajectories.main")
    assert ("User:producer", "WRITE") not in acls_on(bootstrap, admin, f"{run}.weights.main")

    # read back as the analysis principal: the producers sampled with published versions
    reader = reader_config(bootstrap, security)
    topic, newest = f"{run}.trajectories.main", -1
    with open_log("kafka", bootstrap=bootstrap, client_config=reader.log.client_config("analysis")) as log:
        with log.consumer(group_id=None) as consumer:
            partitions = [TopicPartition(topic, p) for p in range(log.describe_topic(topic).partitions)]
            consumer.assign(partitions)
            consumer.seek_to_beginning(partitions)
            while any(consumer.lag().values()):
                for message in consumer.poll(max_records=1000, timeout=2.0):
                    versions = Codec().decode(message.value, expect=Trajectory).token_versions
                    newest = max(newest, int(versions.max()))
        with pytest.raises(Exception, match="principal User:analysis may not write"):
            with log.producer() as producer:
                producer.send(f"{run}.weights.main", b"forged", partition=0)
                producer.flush()
    assert newest >= 2
