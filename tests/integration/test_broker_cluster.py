"""The durable profile: ``astraflow broker start --nodes 3`` and a node killed for good.

Three KRaft nodes on loopback in a temporary home. A run's topic (made, as every component makes
them, without a replication factor) gets three replicas and ``min.insync.replicas`` 2; records
acknowledged before one node is killed with SIGKILL, and records written (in a transaction too)
after it, are all read back from the two nodes left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from astraflow.core.errors import BrokerError
from astraflow.core.ports import free_port
from astraflow.infra.broker.cluster import LocalKafkaCluster
from astraflow.log.base import TopicPartition, TopicSpec
from astraflow.log.kafka.log import KafkaLog
from astraflow.runtime.topics import RunTopics
from tests.integration.test_broker_lifecycle import jar_cache  # noqa: F401  (the fixture)

pytestmark = pytest.mark.kafka

ASTRAFLOW = Path(sys.executable).with_name("astraflow")


def broker_cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ASTRAFLOW), "broker", *args, "--home", str(home)], capture_output=True, text=True, timeout=300
    )


def read_all(log: KafkaLog, topic: str, count: int) -> list[bytes]:
    values: list[bytes] = []
    with log.consumer(group_id=None) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        consumer.seek_to_beginning([TopicPartition(topic, 0)])
        for _ in range(120):
            values += [m.value for m in consumer.poll(max_records=500, timeout=0.5)]
            if len(values) >= count:
                break
    return values


def test_three_nodes_keep_every_acknowledged_record_when_one_dies(jar_cache: Path, tmp_path: Path) -> None:  # noqa: F811
    home, port = tmp_path / "cluster", free_port(span=3)
    started = subprocess.run(
        [str(ASTRAFLOW), "broker", "start", "--nodes", "3", "--port", str(port), "--home", str(home)]
        + ["--jars", str(jar_cache), "--timeout", "180"],
        capture_output=True,
        text=True,
        timeout=400,
    )
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        bootstrap = ",".join(f"127.0.0.1:{port + n}" for n in range(3))
        assert f"bootstrap {bootstrap}" in started.stdout
        assert "3 of 3 nodes running" in broker_cli("status", home=home).stdout

        topic = "durable.trajectories.main"
        with KafkaLog(bootstrap) as log:
            # a run's launcher makes its topics and reads their ends at once, whichever node it asks
            # (on a cluster the nodes learn of a new topic a moment apart)
            for run in range(3):
                names = RunTopics(f"fresh{run}", "math", ("main",))
                names.ensure(log, partitions=2)
                for spec in names.specs(2):
                    assert set(log.end_offsets(spec.name)) == set(range(spec.partitions)), spec
            log.create_topic(TopicSpec(topic, partitions=1))
            admin = AdminClient({"bootstrap.servers": bootstrap})
            metadata = admin.list_topics(topic, timeout=30).topics[topic].partitions[0]
            assert sorted(metadata.replicas) == [1, 2, 3]
            resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
            configs = admin.describe_configs([resource])[resource].result(timeout=30)
            assert configs["min.insync.replicas"].value == "2"

            with log.producer() as producer:
                for i in range(100):
                    producer.send(topic, f"before {i}".encode(), partition=0)
                producer.flush()  # acks=all: on two nodes at least
            victim = LocalKafkaCluster(home).node(metadata.leader)
            os.kill(victim.status().pid, signal.SIGKILL)  # the partition's leader, for good

            with log.producer() as producer:
                for i in range(100):
                    producer.send(topic, f"after {i}".encode(), partition=0)
                producer.flush()
            with log.transactional_producer("durable.train.main") as transactions:
                transactions.begin()
                transactions.send(topic, b"in a transaction", partition=0)
                transactions.commit()
            values = read_all(log, topic, 201)
        assert values == [f"before {i}".encode() for i in range(100)] + [f"after {i}".encode() for i in range(100)] + [
            b"in a transaction"
        ]
        assert "2 of 3 nodes running" in broker_cli("status", home=home).stdout
    finally:
        broker_cli("stop", home=home)
    assert broker_cli("status", home=home).returncode == 3


def test_the_cluster_home_remembers_its_size_and_ports(tmp_path: Path) -> None:
    cluster = LocalKafkaCluster(tmp_path, 3, 19092)
    (tmp_path / "cluster.json").write_text(json.dumps(cluster.meta))
    again = LocalKafkaCluster(tmp_path)
    assert again.bootstrap == "127.0.0.1:19092,127.0.0.1:19093,127.0.0.1:19094"
    assert [node.controller_port for node in again.nodes] == [node.controller_port for node in cluster.nodes]
    with pytest.raises(BrokerError, match="has 3 nodes, not 5"):
        LocalKafkaCluster(tmp_path, 5)
