"""A real node started the way docker-compose.secure.yml starts one, from what ``astraflow broker
secure-config`` wrote: storage formatted with ``format.args``, the broker run on the generated
``server.properties``, the run granted by ``astraflow broker grant --bootstrap --security``, and a
component logged in by role through ``log-security.yaml`` on the host listener (the one compose
publishes). The healthcheck's ``admin-client.properties`` is checked with Kafka's own Java client.

No Docker engine is needed: the node is the local jars' JVM on loopback (host 127.0.0.1), the
same ``kafka.tools.StorageTool`` and ``kafka.Kafka`` that ``kafka-storage.sh`` and
``kafka-server-start.sh`` run in the image.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from astraflow.config.log import load_security
from astraflow.config.run import write_config_over
from astraflow.core.errors import DeliveryError, LogError
from astraflow.core.ports import free_port
from astraflow.infra.broker import host
from astraflow.infra.broker.container import ADMIN_CLIENT, FORMAT_ARGS, LOG_SECURITY, PROPERTIES
from astraflow.infra.broker.host import new_cluster_id
from astraflow.infra.broker.jars import KAFKA_VERSION
from astraflow.log import open_log
from astraflow.runtime.topics import RunTopics
from tests._broker import unavailable
from tests.integration.test_broker_lifecycle import jar_cache  # noqa: F401  (the fixture)

pytestmark = pytest.mark.kafka

ASTRAFLOW = Path(sys.executable).with_name("astraflow")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "math" / "config.yaml"
RUN = RunTopics("box", "math", ("main",))
HOST = "127.0.0.1"

HEALTHCHECK = """
import java.io.FileInputStream;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;

public class Healthcheck {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        try (FileInputStream in = new FileInputStream(args[0])) { props.load(in); }
        props.put("bootstrap.servers", args[1]);
        try (Admin admin = Admin.create(props)) {
            System.out.println("nodes=" + admin.describeCluster().nodes().get(60, TimeUnit.SECONDS).size());
        }
    }
}
"""


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(ASTRAFLOW), *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def node(jar_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int, int]]:  # noqa: F811
    """A node formatted and started as the compose stack does; (security directory, client port, host port)."""
    root = tmp_path_factory.mktemp("compose-node")
    out, port, external = root / "security", free_port(), free_port()
    generated = cli(
        "broker", "secure-config", "--out", str(out), "--hosts", HOST, "--bind", HOST, "--data-dir", str(root / "data"),
        "--port", str(port), "--internal-port", str(free_port()), "--controller-port", str(free_port()),
        "--external", f"{HOST}:{external}", "--external-port", str(external),
    )  # fmt: skip
    assert generated.returncode == 0, generated.stdout + generated.stderr
    java, libs = host.java(), f"{jar_cache / f'libs-{KAFKA_VERSION}'}/*"
    properties = str(out / HOST / PROPERTIES)
    scram = (out / FORMAT_ARGS).read_text().splitlines()
    format_ = [java, "-cp", libs, "kafka.tools.StorageTool", "format", "--ignore-formatted"]
    formatted = subprocess.run(
        [*format_, "--cluster-id", new_cluster_id(), "--config", properties, *scram],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert formatted.returncode == 0, formatted.stdout + formatted.stderr
    log = root / "broker.log"
    with log.open("wb") as output:
        proc = subprocess.Popen(
            [java, "-Xmx512m", "-cp", libs, "kafka.Kafka", properties],
            stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    try:
        wait_serving(out, f"{HOST}:{port}", proc, log)
        yield out, port, external
    finally:
        stop(proc)


def wait_serving(out: Path, bootstrap: str, proc: subprocess.Popen, log: Path, timeout: float = 90.0) -> None:
    """Return once the admin (by role_credentials) gets metadata; skip (fail in CI) if the node never serves."""
    admin = load_security(out / LOG_SECURITY).client_config()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with open_log("kafka", bootstrap=bootstrap, client_config=admin):
                return
        except LogError:
            time.sleep(0.5)
    unavailable(f"the generated node did not serve within {timeout:.0f}s:\n{log.read_text(errors='replace')[-3000:]}")


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the node's process group (a controlled shutdown), SIGKILL if it lingers."""
    for sig, wait_s in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(wait_s)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def test_a_role_works_through_the_generated_files_and_only_within_its_acls(node, tmp_path: Path) -> None:
    out, port, external = node
    config = write_config_over(EXAMPLE, tmp_path / "run.yaml", run=RUN.run)
    granted = cli(
        "broker", "grant", str(config), "--bootstrap", f"{HOST}:{port}", "--security", str(out / LOG_SECURITY)
    )
    assert granted.returncode == 0, granted.stdout + granted.stderr
    security = load_security(out / LOG_SECURITY)
    # through the host listener, as the feeder: what docker-compose publishes on 127.0.0.1:9094-9096
    with open_log("kafka", bootstrap=f"{HOST}:{external}", client_config=security.client_config("feed")) as log:
        with log.producer() as producer:
            producer.send(RUN.tasks(), b"probe", partition=0)
            producer.flush()
        with pytest.raises(DeliveryError, match=f"principal User:feeder may not WRITE topic {RUN.weights('main')}"):
            with log.producer() as producer:
                producer.send(RUN.weights("main"), b"probe", partition=0)
                producer.flush()


def test_the_healthcheck_client_settings_work_with_the_java_client(node, jar_cache: Path, tmp_path: Path) -> None:  # noqa: F811
    out, port, _ = node
    source = tmp_path / "Healthcheck.java"
    source.write_text(HEALTHCHECK)
    libs = f"{jar_cache / f'libs-{KAFKA_VERSION}'}/*"
    done = subprocess.run(
        [host.java(), "-cp", libs, str(source), str(out / ADMIN_CLIENT), f"{HOST}:{port}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if done.returncode != 0 and "jdk.compiler" in done.stderr:
        unavailable(f"this Java cannot run a source file (no jdk.compiler module): {done.stderr.strip()[:300]}")
    assert done.returncode == 0 and "nodes=1" in done.stdout, done.stdout + done.stderr[-3000:]
