"""The secure dev broker: ``astraflow broker start --secure`` and ``astraflow broker grant``.

A real KRaft broker with SASL_SSL (SCRAM-SHA-512 over TLS, a CA made locally) and the
``StandardAuthorizer``, started, granted and stopped through the command line as a user would.
Each principal is checked both ways - what it may do works, what it may not is refused with a
message naming the principal, the resource and the operation - so the test fails on ACLs that are
too broad as surely as on ones too narrow.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from astraflow.config import load_config, parse_config
from astraflow.config.run import write_config_over
from astraflow.core.errors import DeliveryError, LogError
from astraflow.core.ports import free_port
from astraflow.infra.broker.secure import SecurityFiles
from astraflow.log import open_log
from astraflow.log.base import TopicPartition
from astraflow.runtime.topics import RunTopics
from tests.integration.test_broker_lifecycle import jar_cache  # noqa: F401  (the fixture)

pytestmark = pytest.mark.kafka

ASTRAFLOW = Path(sys.executable).with_name("astraflow")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "math" / "config.yaml"
RUN = RunTopics("sec", "math", ("main",))


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(ASTRAFLOW), *args], capture_output=True, text=True, timeout=400)


def start_secure(home: Path, jar_cache: Path, nodes: int):  # noqa: F811
    """Start a secure broker of ``nodes`` nodes in ``home`` and grant the run ``sec``; its bootstrap."""
    port = free_port() if nodes == 1 else free_port(span=3)
    size = [] if nodes == 1 else ["--nodes", str(nodes), "--timeout", "180"]
    started = cli(
        "broker", "start", "--secure", *size, "--home", str(home), "--port", str(port), "--jars", str(jar_cache)
    )
    assert started.returncode == 0, started.stdout + started.stderr
    assert "secure: SASL_SSL, SCRAM-SHA-512" in started.stdout
    bootstrap = ",".join(f"127.0.0.1:{port + n}" for n in range(nodes))
    config = write_config_over(EXAMPLE, home.parent / "run.yaml", run="sec", log={"bootstrap": bootstrap})
    granted = cli("broker", "grant", str(config), "--home", str(home))
    assert granted.returncode == 0, granted.stdout + granted.stderr
    return bootstrap


@pytest.fixture(scope="module")
def secure_broker(jar_cache: Path, tmp_path_factory: pytest.TempPathFactory):  # noqa: F811
    """A secure single-node broker with the run ``sec`` granted."""
    home = tmp_path_factory.mktemp("secure") / "broker"
    try:
        yield start_secure(home, jar_cache, 1), SecurityFiles(home / "security")
    finally:
        cli("broker", "stop", "--home", str(home))


def test_three_secure_nodes_replicate_over_tls_and_enforce_the_acls(jar_cache: Path, tmp_path: Path) -> None:  # noqa: F811
    home = tmp_path / "cluster"
    try:
        bootstrap = start_secure(home, jar_cache, 3)
        files = SecurityFiles(home / "security")
        with as_principal(bootstrap, files, "producer") as log:
            write(log, RUN.trajectories("main"))  # acks=all: on two of the three nodes
            with pytest.raises(DeliveryError, match="principal User:producer may not WRITE topic sec.weights.main"):
                write(log, RUN.weights("main"))
        with as_principal(bootstrap, files, "trainer") as log:
            write(log, RUN.weights("main"), partition=1)
        bad = {**files.client_config("producer"), "sasl.password": "wrong"}
        with pytest.raises(LogError, match="refused user 'producer'"):
            open_log("kafka", bootstrap=bootstrap, client_config=bad)
    finally:
        cli("broker", "stop", "--home", str(home))


def as_principal(bootstrap: str, files: SecurityFiles, principal: str):
    """The log a component of ``principal`` opens: from a run config's ``log.security``."""
    config = parse_config(
        {"log": {"backend": "kafka", "bootstrap": bootstrap, "security": files.log_security(principal)}}
    )
    return open_log("kafka", bootstrap=bootstrap, client_config=config.log.client_config())


def write(log, topic: str, partition: int = 0) -> None:
    with log.producer() as producer:
        producer.send(topic, b"probe", partition=partition)
        producer.flush()


def test_the_home_keeps_its_secrets_private(secure_broker) -> None:
    _, files = secure_broker
    assert stat.S_IMODE(files.directory.stat().st_mode) == 0o700
    for path in [files.ca_key, files.node, files.password_file("admin"), files.password_file("producer")]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    servers = list(files.directory.parent.glob("**/server.properties"))
    assert servers
    for server in (path.read_text() for path in servers):
        assert files.password("admin") not in server and "PLAINTEXT://" not in server


def test_a_wrong_password_and_a_plaintext_client_are_refused(secure_broker, tmp_path: Path) -> None:
    bootstrap, files = secure_broker
    (tmp_path / "wrong").write_text("not-the-password\n")
    os.chmod(tmp_path / "wrong", 0o600)
    security = {**files.log_security("producer"), "password_file": str(tmp_path / "wrong")}
    config = parse_config({"log": {"backend": "kafka", "bootstrap": bootstrap, "security": security}})
    with pytest.raises(LogError, match="refused user 'producer' \\(SCRAM-SHA-512\\).*[Aa]uthentication failed"):
        open_log("kafka", bootstrap=bootstrap, client_config=config.log.client_config())
    from astraflow.log.kafka.log import KafkaLog

    with pytest.raises(LogError, match=f"cannot reach the Kafka cluster at {bootstrap}"):
        KafkaLog(bootstrap, connect_timeout_s=5)


def test_a_producer_writes_trajectories_but_not_weights_samples_or_the_ledger(secure_broker) -> None:
    bootstrap, files = secure_broker
    with as_principal(bootstrap, files, "producer") as log:
        write(log, RUN.trajectories("main"))
        for topic in (RUN.weights("main"), RUN.samples("main"), RUN.ledger("main")):
            with pytest.raises(DeliveryError, match=f"principal User:producer may not WRITE topic {topic}"):
                write(log, topic)
        with pytest.raises(LogError, match="principal User:producer may not"):
            with log.transactional_producer("sec.train.main") as stolen:  # the trainer's transactional id
                stolen.begin()
                stolen.send(RUN.trajectories("main"), b"x", partition=0)
                stolen.commit()


def test_the_trainer_writes_weights_and_the_ledger_and_the_stream_writes_samples(secure_broker) -> None:
    bootstrap, files = secure_broker
    with as_principal(bootstrap, files, "trainer") as log:
        write(log, RUN.weights("main"), partition=1)
        write(log, RUN.ledger("main"))
        with pytest.raises(DeliveryError, match="principal User:trainer may not WRITE topic sec.trajectories.main"):
            write(log, RUN.trajectories("main"))
    with as_principal(bootstrap, files, "stream") as log:
        write(log, RUN.samples("main"))
        with pytest.raises(DeliveryError, match="principal User:stream may not WRITE topic sec.weights.main"):
            write(log, RUN.weights("main"))


def test_an_analysis_principal_reads_everything_and_writes_nothing(secure_broker) -> None:
    bootstrap, files = secure_broker
    with as_principal(bootstrap, files, "producer") as log:
        write(log, RUN.trajectories("main"), partition=1)  # this test's own record (tests may run apart)
    with as_principal(bootstrap, files, "analysis") as log:
        topic = RUN.trajectories("main")
        with log.consumer(group_id=None) as consumer:
            partitions = [TopicPartition(topic, p) for p in range(log.describe_topic(topic).partitions)]
            consumer.assign(partitions)
            consumer.seek_to_beginning(partitions)
            read = []
            for _ in range(40):
                read += consumer.poll(max_records=100, timeout=0.5)
                if any(m.partition == 1 for m in read):
                    break
        assert b"probe" in [m.value for m in read if m.partition == 1]  # what the producer principal wrote
        for topic in (*RUN.metrics_topics(), *RUN.deadletter_topics(), RUN.trajectories("main")):
            with pytest.raises(DeliveryError, match="principal User:analysis may not write to the log"):
                write(log, topic)
        with pytest.raises(LogError, match="principal User:analysis may not CREATE topic 'sec.extra'"):
            from astraflow.log.base import TopicSpec

            log.create_topic(TopicSpec("sec.extra", partitions=1))


def test_analysis_commands_reach_the_secure_cluster_with_security_and_write_nothing(
    secure_broker, tmp_path: Path
) -> None:
    """``tail``, ``export`` and ``runs`` given only ``--bootstrap`` log in through ``--security``: a run
    config whose ``log.security`` names the roles' credentials, so they read as ``analysis``."""
    import yaml

    bootstrap, files = secure_broker
    with as_principal(bootstrap, files, "producer") as log:
        write(log, RUN.trajectories("main"), partition=0)  # not Avro: export counts it as skipped
    security = {
        "protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "role_credentials": str(files.directory),
        "ca_file": str(files.ca),
    }
    run_config = tmp_path / "run.yaml"
    run_config.write_text(yaml.safe_dump({"log": {"backend": "kafka", "bootstrap": bootstrap, "security": security}}))
    listed = cli(
        "runs", "ls", "--root", str(tmp_path / "none"), "--bootstrap", bootstrap, "--security", str(run_config)
    )
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert "sec" in listed.stdout
    out = tmp_path / "trajectories.jsonl"
    topic = RUN.trajectories("main")
    exported = cli("export", topic, "--out", str(out), "--bootstrap", bootstrap, "--security", str(run_config))
    assert exported.returncode == 0, exported.stdout + exported.stderr
    assert f"{out}: 0 records (skipped:" in exported.stdout  # it read the raw probes, as analysis
    # runs rm deletes as admin; with a single analysis user it is refused by the broker, by name.
    analysis_only = tmp_path / "analysis.yaml"
    analysis_only.write_text(yaml.safe_dump(files.log_security("analysis")))
    refused = cli("runs", "rm", "sec", "--bootstrap", bootstrap, "--security", str(analysis_only), "--yes", "--force")
    assert refused.returncode != 0
    assert "principal User:analysis may not DELETE topic 'sec." in refused.stdout + refused.stderr


def test_forged_control_records_are_refused_or_ignored_counted_and_reported(secure_broker, tmp_path: Path) -> None:
    """What steers a run believes only the role allowed to say it (``runtime/control.py``). The producer
    principal is refused on every other role's metrics and dead-letter topics; what it writes on its
    own - ``eval.accuracy`` 1.0, ``train.version`` 1e6, ``scaler.desired_producers`` 8, a dead letter
    naming a trajectory - the launcher's monitor ignores: the run stops on its own rule (versions),
    ``summary.json``'s figures are the evaluator's and trainer's, and each forgery is counted and
    dead-lettered on the launcher's topic. ``astraflow stats`` and ``audit`` leave them out too."""
    from astraflow.analysis.audit import audit_run
    from astraflow.analysis.stats import collect_stats
    from astraflow.infra.launch.launcher import ForgeryReporter
    from astraflow.infra.launch.monitor import RunMonitor
    from astraflow.runtime.attach import open_run
    from astraflow.runtime.context import ComponentContext
    from astraflow.schemas.codec import Codec
    from astraflow.schemas.records import DeadLetter

    bootstrap, files = secure_broker
    security = {**files.role_security(), "ca_file": str(files.ca)}
    log = {"backend": "kafka", "bootstrap": bootstrap, "security": security}
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    stop = {"max_versions": 2, "target_accuracy": 0.9}
    config = load_config(write_config_over(EXAMPLE, run_dir / "config.yaml", run="sec", log=log, stop=stop))
    forger, evaluator, trainer, launcher = (
        ComponentContext(config, run_dir, name) for name in ("rollout", "evaluate", "train", "launcher")
    )
    codec = Codec()
    try:
        for role in ("evaluator", "trainer", "scaler", "stream"):
            with pytest.raises(DeliveryError, match=f"principal User:producer may not WRITE topic sec.metrics.{role}"):
                write(forger.log, RUN.metrics(role))
        with pytest.raises(DeliveryError, match="principal User:producer may not WRITE topic sec.deadletter.stream"):
            write(forger.log, RUN.deadletter("stream"))
        forger.metric("eval.accuracy", 1.0, 1, policy="main")
        forger.metric("train.version", 1e6, 1e6, policy="main")
        forger.metric("scaler.desired_producers", 8, 1)
        lost = DeadLetter("rollout-x", "forged", "", RUN.trajectories("main"), 0, 0, None, b"", 0)
        forger.producer.send(RUN.deadletter("producer"), codec.encode(lost))
        forger.producer.flush()
        for version, accuracy in ((0, 0.3), (1, 0.4), (2, 0.5)):
            evaluator.metric("eval.accuracy", accuracy, version, policy="main")
            trainer.metric("train.version", version, version, policy="main")
        for context in (evaluator, trainer):
            context.producer.flush()

        monitor = RunMonitor(config, run_dir, launcher.log, RUN, report=ForgeryReporter(launcher))
        deadline = time.monotonic() + 60
        while monitor.done() is None and time.monotonic() < deadline:
            monitor._consume(timeout=1.0)
        assert monitor.done() == "2 versions trained"
        monitor.drain()
        summary = monitor.summary(warmup_seconds=0, interrupted=False)
        assert (summary["final_accuracy"], summary["versions"]) == (0.5, 2)
        assert summary["accuracy_by_version"] == {"0": 0.3, "1": 0.4, "2": 0.5}
        assert summary["forgeries"] == {"metrics": 3, "dead_letters": 1}
        assert monitor.producers.decision is None  # the forged scaler decision resizes nothing

        with open_run(run_dir) as run:
            reports = [letter for _, letter in decode(run.log, RUN.deadletter("admin"), codec)]
            stats = collect_stats(run)
            audit = audit_run(run)
        assert (
            sorted(letter.topic for letter in reports) == [RUN.deadletter("producer")] + [RUN.metrics("producer")] * 3
        )
        assert all(letter.reason.startswith("forged record: ") for letter in reports)
        assert stats.forged == 4 and stats.dead_letters == {"forged record": 4}  # the launcher's reports
        assert len(audit.forged_letters) == 1 and "does not read that topic" in audit.forged_letters[0]
    finally:
        for context in (forger, evaluator, trainer, launcher):
            context.close()


def decode(log, topic: str, codec):
    """Every record of ``topic`` (one partition), decoded, but the other tests' probes."""
    with log.consumer(group_id=None) as consumer:
        partition = TopicPartition(topic, 0)
        end = log.end_offsets(topic)[0]
        consumer.assign([partition])
        consumer.seek_to_beginning()
        while consumer.position(partition) < end:
            for message in consumer.poll(max_records=100, timeout=1.0):
                if message.value != b"probe":  # what the ACL tests above write
                    yield message, codec.decode(message.value)


def test_on_the_secure_broker_the_stream_trains_only_answers_to_issued_tasks(secure_broker, tmp_path: Path) -> None:
    """``stream.verify_tasks: auto`` is on where each role logs in as itself: the stream principal reads
    the tasks the feeder principal issued and dead-letters the producer principal's trajectory whose
    prompt is not its task's, while the genuine group becomes samples."""
    import dataclasses

    import numpy as np

    from astraflow.basemodel.tiny import create_tiny_checkpoint
    from astraflow.engines.base import encode_prompts
    from astraflow.engines.loading import load_tokenizer
    from astraflow.log import Message
    from astraflow.runtime.context import ComponentContext
    from astraflow.schemas.records import RolloutTask
    from astraflow.streams.runtimes.native import NativeStreamProcessor
    from tests.unit.test_stream_operators import traj

    bootstrap, files = secure_broker
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    base = create_tiny_checkpoint(tmp_path / "base")
    log = {"backend": "kafka", "bootstrap": bootstrap, "partitions": 1, "security": {**files.role_security()}}
    raw = {"run": "sec", "log": log, "model": {"path": str(base)}, "rollout": {"group_size": 2}}
    config = load_config(write_config_over(EXAMPLE, run_dir / "config.yaml", **raw, stream={"runtime": "native"}))
    feeder, producer, stream = (ComponentContext(config, run_dir, name) for name in ("feed", "rollout", "stream"))
    prompt = encode_prompts(load_tokenizer(base), ["12+35="], False)[0]
    try:
        for group in ("tg", "tf"):
            issued = RolloutTask(group, f"p-{group}", group, "math", "12+35=", "47", 2, 0, 0)
            feeder.producer.send(RUN.tasks(), feeder.codec.encode(issued), key=group.encode(), partition=0)
        feeder.producer.flush()
        answers = [
            dataclasses.replace(traj(group, index, float(1 - index), size=2), prompt_id=f"p-{group}", prompt_ids=ids)
            for group, ids in (("tg", prompt), ("tf", np.array([5, 6, 7], dtype=np.int32)))
            for index in range(2)
        ]
        processor = NativeStreamProcessor(stream, "main")
        assert processor.tasks is not None  # auto: on, the log authenticating each role
        topic = RUN.trajectories("main")
        processor.transactions.begin()
        accepted = []
        for offset, answer in enumerate(answers):
            done = processor._add(Message(topic, 0, offset, answer.group_id.encode(), stream.codec.encode(answer), 0))
            if done is not None and processor._process(done, 0):
                accepted.append(done)
        processor._emit(accepted, 0)
        processor.transactions.commit()
        processor.close_followers()
    finally:
        for context in (feeder, producer, stream):
            context.close()
    with as_principal(bootstrap, files, "analysis") as reader:
        letters = [letter for _, letter in decode(reader, RUN.deadletter("stream"), stream.codec)]
        samples = [sample for _, sample in decode(reader, RUN.samples("main"), stream.codec)]
    forged = [letter for letter in letters if letter.key == b"tf"]
    assert [letter.reason.split(": ", 2)[1] for letter in forged] == ["prompt_ids"] * 2, [x.reason for x in letters]
    assert {sample.sample_id for sample in samples} >= {"tg/0", "tg/1"}
    assert not any(sample.sample_id.startswith("tf/") for sample in samples)
