"""The compose stack in containers against the same run as local processes (issue #56).

Containers: ``scripts/stack.sh up`` (with ``--secure``: the secure variant), as a user brings the stack
up: it builds whatever image is missing, then starts docker-compose.yml's three Kafka nodes and the math
example's components (feed, the rollout producers, stream, train, evaluate), one container each, all
reading the image's ``examples/math/config.yaml``. The build (``scripts/stack.sh build``) is timed
apart from ``up``. The components have no stop condition of their own (``stop.*`` is read only by
``astraflow run``'s monitor, and the compose files pass no override), so nothing in the stack can be
told to stop at ``--versions``: this script reads the trainer's metrics from the host through the
published ports, as ``scripts/stack.sh astraflow`` and tests/e2e/test_compose_stack.py do, every
``--poll`` seconds, and once version ``--versions`` is published runs ``scripts/stack.sh stop`` (SIGTERM
to the components, the evaluator last, after it scored the final version). ``--minutes`` caps the wait.
Before the stack is taken down it records every container (its service, image and restart count),
every image the stack built or ran (id, digest, repository digests, size), the engine's and the
compose tool's versions, and ``astraflow audit`` from the host. ``scripts/stack.sh down --volumes``
takes it down at the end, on failure too. The stack runs as its own compose project (``--project``),
so it never takes down a stack someone else brought up (but it needs the published ports 9094-9096).

Local processes: the same layout, read from docker-compose.yml rather than assumed: as many KRaft
nodes (each broker and controller), the same replication factor and in-sync replicas (checked against
what ``LocalKafkaCluster`` gives that many nodes), as many rollout producers as the rollout service's
replicas, and the stream runtime the stream service runs (its ``--runtime``, else the config's on
Kafka: faust). A fresh ``LocalKafkaCluster`` (with ``--secure``: ``astraflow broker start --secure
--nodes N``, which also sets the client quotas per role, as the secure stack's ``quotas`` one shot does),
then ``astraflow run examples/math/config.yaml`` on it with only ``log``, ``rollout.producers``,
``stream.runtime`` and ``stop`` changed (``stop.max_versions`` = ``--versions``).

Both sides are measured the same way, from the run's own records, never from wall time around a
command: a version's time is the ``created_ms`` of the trainer's first ``train.version`` metric for it
(the stack: read from ``{run}.metrics.trainer`` on the cluster; the local run: ``metrics.jsonl``, whose
``wall_s`` the run monitor derives from the same field), and versions per minute run from version 1
to version ``--versions`` (image build, start-up, warm-up and the base evaluation left out; the stack
may train a version or two past the target before ``stop`` lands, which is not counted). Held-out
accuracy by version is ``eval.accuracy`` (the example's 200 problems every 5 versions); the gain is the
mean of the last two evaluations minus the base (version 0).

Both sides run on the same machine one after the other, so its load moves both: the load average is
recorded before and after each side and in the provenance. The local run has the launcher's run
monitor besides the components (one more consumer of the metrics topics); the stack has none.

Writes ``results/compose_stack.json`` (with its provenance: ``provenance.py``) and
``results/compose_stack.png``, and prints one line with the ratio containers / local.

    .venv/bin/python benchmarks/compose_stack.py [--versions 100] [--minutes 40] [--secure]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provenance import begin, finish

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
EXAMPLE = REPO / "examples" / "math" / "config.yaml"
COMPOSE = REPO / "docker-compose.yml"
STACK = REPO / "scripts" / "stack.sh"
ASTRAFLOW = Path(sys.executable).with_name("astraflow")
COMPONENTS = ("feed", "rollout", "stream", "train", "evaluate")
"""docker-compose.yml's services that run the math example (scripts/stack.sh's COMPONENTS)."""


# --- the stack ------------------------------------------------------------------------------------


class Stack:
    """``scripts/stack.sh`` on one compose project, the plain or the secure variant."""

    def __init__(self, project: str, secure: bool) -> None:
        self.project = project
        self.secure = secure
        self.env = {**os.environ, "ASTRAFLOW_STACK_PROJECT": project}
        self.said: list[str] = []
        """The script's own progress lines (``stack: ...`` on stderr) of build, up, stop and down."""

    def __call__(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [str(STACK), *args], cwd=REPO, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        self.said += [line for line in done.stderr.splitlines() if line.startswith("stack: ")]
        if check and done.returncode != 0:
            raise RuntimeError(
                f"scripts/stack.sh {' '.join(args)} exited {done.returncode}:\n"
                f"{done.stdout[-2000:]}{done.stderr[-4000:]}"
            )
        return done

    def variant(self) -> list[str]:
        return ["--secure"] if self.secure else []

    def engine(self, *args: str, timeout: float = 120, check: bool = True) -> str:
        return self("engine", *args, timeout=timeout, check=check).stdout

    def down(self) -> None:
        self("down", *self.variant(), "--volumes", timeout=900)


def stack_metrics(config_path: Path) -> tuple[dict[int, float], dict[int, float]]:
    """The stack's trainer and evaluator metrics, read from the host as ``scripts/stack.sh astraflow``
    reads (on the secure stack as the ``analysis`` principal): version -> seconds (epoch) of its first
    ``train.version`` record, and version -> held-out accuracy (the newest record of a version wins)."""
    from astraflow.config import load_config
    from astraflow.core.metric_names import EVAL_ACCURACY, TRAIN_VERSION
    from astraflow.log import open_log
    from astraflow.runtime.attach import read_snapshot
    from astraflow.schemas.codec import Codec
    from astraflow.schemas.records import Metric

    codec = Codec()
    config = load_config(config_path)
    versions: dict[int, float] = {}
    accuracy: dict[int, float] = {}
    with open_log("kafka", bootstrap=config.log.bootstrap, client_config=config.log.client_config("analysis")) as log:
        topics = set(log.list_topics())
        for role, name in (("trainer", TRAIN_VERSION), ("evaluator", EVAL_ACCURACY)):
            topic = f"{config.run}.metrics.{role}"
            if topic not in topics:
                continue
            for message in read_snapshot(log, topic):
                metric = codec.decode(message.value, expect=Metric)
                if metric.name != name:
                    continue
                if name == TRAIN_VERSION:
                    version, at = int(metric.value), metric.created_ms / 1000
                    versions[version] = min(at, versions.get(version, at))
                else:
                    accuracy[int(metric.step)] = metric.value
    return versions, accuracy


def inspect_containers(stack: Stack) -> list[dict]:
    """Every container of the stack's project: its service, image and restarts (``engine inspect``)."""
    ids = stack.engine("ps", "-a", "-q", "--filter", f"label=com.docker.compose.project={stack.project}").split()
    if not ids:
        return []
    found = []
    for item in json.loads(stack.engine("inspect", *ids)):
        config = item.get("Config") or {}
        labels = config.get("Labels") or {}
        state = item.get("State") or {}
        found.append(
            {
                "name": item.get("Name", "").lstrip("/"),
                "service": labels.get("com.docker.compose.service"),
                "image": item.get("ImageName") or config.get("Image"),
                "image_id": item.get("Image"),
                "restarts": item.get("RestartCount"),
                "status": state.get("Status"),
                "exit_code": state.get("ExitCode"),
            }
        )
    return sorted(found, key=lambda c: (c["service"] or "", c["name"]))


def image_names() -> list[str]:
    """The images scripts/stack.sh builds (ASTRAFLOW_STACK_IMAGES=local, podman's default) and the public
    ones the compose files and the Dockerfile name (Docker's default), as the script names them."""
    script = STACK.read_text()
    kafka = re.search(r"^KAFKA_VERSION=(\S+)$", script, re.M).group(1)
    suite = re.search(r"^SUITE=(\S+)$", script, re.M).group(1)
    uv = re.search(r"^ARG UV_VERSION=(\S+)$", (REPO / "Dockerfile").read_text(), re.M).group(1)
    return [
        "astraflow:latest",
        f"localhost/astraflow-kafka:{kafka}",
        f"localhost/astraflow-base:{suite}",
        f"localhost/astraflow-uv:{uv}",
        f"apache/kafka:{kafka}",
        "python:3.11-slim",
        f"ghcr.io/astral-sh/uv:{uv}",
    ]


def inspect_images(stack: Stack, containers: list[dict]) -> dict[str, dict]:
    """Id, digest, repository digests and size of each image the stack ran (its containers') or was
    built from, by the name it was asked by; an image asked by several names is recorded once."""
    wanted = image_names()
    wanted += [c["image_id"] for c in containers if c["image_id"]]
    images: dict[str, dict] = {}
    seen: set[str] = set()
    for name in wanted:
        done = stack("engine", "image", "inspect", name, timeout=120, check=False)
        if done.returncode != 0:
            continue
        [item] = json.loads(done.stdout)
        if item["Id"] in seen:
            continue
        seen.add(item["Id"])
        used_by = sorted(
            {c["service"] for c in containers if c["image_id"] and item["Id"].endswith(c["image_id"].split(":")[-1])}
        )
        tags = item.get("RepoTags") or []
        images[tags[0] if tags else name] = {
            "asked_as": name,
            "tags": tags,
            "id": item["Id"],
            "digest": item.get("Digest"),
            "repo_digests": item.get("RepoDigests") or [],
            "size_bytes": item.get("Size"),
            "size_mb": round(item["Size"] / 1e6, 1) if item.get("Size") else None,
            "created": item.get("Created"),
            "used_by": used_by,
        }
    return images


def tool_versions(stack: Stack) -> dict:
    """The engine the stack ran under, its OCI runtime, and the compose tool (with its pins)."""

    def text(*args: str) -> str:
        done = stack(*args, timeout=300, check=False)
        return (done.stdout.strip() or done.stderr.strip()) if done.returncode == 0 else f"failed: {done.stderr[-300:]}"

    pins = (REPO / "deploy" / "stack" / "compose-requirements.txt").read_text().splitlines()
    return {
        "engine": text("engine", "--version"),
        "oci_runtime": text("engine", "info", "--format", "{{.Host.OCIRuntime.Name}} {{.Host.OCIRuntime.Version}}"),
        "compose": text("compose", "version"),
        "compose_requirements": [line for line in pins if line and not line.startswith("#")],
    }


def audit_summary(done: subprocess.CompletedProcess) -> dict:
    """The headline of ``astraflow audit --json`` (which exits 1 when the audit finds a problem): ok, and
    per key a count (lists counted); what went wrong where it printed no report."""
    try:
        report = json.loads(done.stdout)
        [policy] = report["policies"]
    except (ValueError, KeyError) as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "output": (done.stdout + done.stderr)[-2000:]}
    summary = {"ok": report["ok"]}
    for key in ("trained", "filtered", "dead_lettered", "pending", "lost", "trained_twice", "lost_versions"):
        value = policy.get(key)
        summary[key] = len(value) if isinstance(value, (list, dict)) else value
    return summary


def containers_side(args: argparse.Namespace) -> dict:
    """Build, bring the stack up, train to ``--versions``, stop, record, and always take it down."""
    stack = Stack(args.project, args.secure)
    load_before = list(os.getloadavg())
    stack.down()  # this project's leftovers, if any: a fresh cluster and run directory
    try:
        started = time.monotonic()
        stack("build", timeout=3600)
        build_s = time.monotonic() - started
        started = time.monotonic()
        stack("up", *stack.variant(), timeout=3600)
        up_s = time.monotonic() - started
        config_path = Path(stack("host-config", timeout=300).stdout.strip())
        deadline = time.monotonic() + args.minutes * 60
        versions: dict[int, float] = {}
        poll_error = None
        while time.monotonic() < deadline:
            try:
                versions, _ = stack_metrics(config_path)
                poll_error = None
            except Exception as exc:  # the cluster briefly unreachable: try again until the cap
                poll_error = f"{type(exc).__name__}: {exc}"
            if max(versions, default=0) >= args.versions:
                break
            print(f"containers: version {max(versions, default=0)} of {args.versions}", flush=True)
            time.sleep(args.poll)
        stopping = time.monotonic()
        stack("stop", timeout=900)
        stop_s = time.monotonic() - stopping
        versions, accuracy = stack_metrics(config_path)
        containers = inspect_containers(stack)
        images = inspect_images(stack, containers)
        tools = tool_versions(stack)
        audit = None
        if args.audit:
            audit = audit_summary(stack("astraflow", "audit", "--json", timeout=1800, check=False))
    finally:
        stack.down()
    side = measure(versions, accuracy, args.versions)
    return side | {
        "project": args.project,
        "secure": args.secure,
        "build_seconds": build_s,
        "up_seconds": up_s,
        "stop_seconds": stop_s,
        "last_poll_error": poll_error,
        "containers": containers,
        "restarts": sum(c["restarts"] or 0 for c in containers),
        "images": images,
        "images_total_mb": round(sum(i["size_mb"] or 0 for i in images.values()), 1),
        "tools": tools,
        "audit": audit,
        "stack_said": stack.said,
        "load_before": load_before,
        "load_after": list(os.getloadavg()),
    }


# --- the same run as local processes ---------------------------------------------------------------


def compose_layout() -> dict:
    """What docker-compose.yml runs: the Kafka nodes and their replication, the rollout replicas, the
    stream service's runtime and every component's config and bootstrap."""
    import yaml

    from astraflow.config import load_config

    services = yaml.safe_load(COMPOSE.read_text())["services"]
    nodes = {
        name: service["environment"]
        for name, service in services.items()
        if "KAFKA_NODE_ID" in (service.get("environment") or {}) and not service.get("profiles")
    }

    def one(key: str) -> int:
        values = {int(environment[key]) for environment in nodes.values()}
        if len(values) != 1:
            raise SystemExit(f"docker-compose.yml: the Kafka nodes differ in {key}: {sorted(values)}")
        return values.pop()

    commands = {name: services[name]["command"] for name in COMPONENTS}
    configs = {command[1] for command in commands.values()}
    bootstraps = {command[command.index("--bootstrap") + 1] for command in commands.values()}
    if configs != {str(EXAMPLE.relative_to(REPO))} or len(bootstraps) != 1:
        raise SystemExit(f"docker-compose.yml: components on configs {configs}, bootstraps {bootstraps}")
    stream = commands["stream"]
    runtime = stream[stream.index("--runtime") + 1] if "--runtime" in stream else None
    if runtime is None:  # the container's own resolution: the config with --backend kafka --bootstrap ...
        config = load_config(EXAMPLE, {"log.backend": "kafka", "log.bootstrap": bootstraps.pop()})
        runtime = config.for_policy(config.policy_names()[0]).stream_runtime()
    return {
        "kafka_nodes": sorted(nodes),
        "replication_factor": one("KAFKA_DEFAULT_REPLICATION_FACTOR"),
        "min_insync_replicas": one("KAFKA_MIN_INSYNC_REPLICAS"),
        "internal_topic_partitions": one("KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS"),
        "rollout_replicas": int((services["rollout"].get("deploy") or {}).get("replicas", 1)),
        "stream_runtime": runtime,
        "stream_runtime_from": "the stream service's --runtime" if "--runtime" in stream else "the config on Kafka",
        "config": str(EXAMPLE.relative_to(REPO)),
    }


def start_cluster(home: Path, nodes: int, secure: bool):
    """A fresh local cluster of ``nodes`` nodes: (bootstrap, log.security or None, stop)."""
    from astraflow.core.ports import free_port
    from astraflow.infra.broker.local import default_home

    port = free_port(span=nodes)
    if not secure:
        from astraflow.infra.broker.cluster import LocalKafkaCluster

        cluster = LocalKafkaCluster(home, nodes, port, jar_cache=default_home())
        cluster.start(timeout=180)
        return cluster.bootstrap, None, cluster.stop
    command = [str(ASTRAFLOW), "broker", "start", "--home", str(home), "--port", str(port), "--nodes", str(nodes)]
    command += ["--jars", str(default_home()), "--timeout", "180", "--secure"]
    started = subprocess.run(command, capture_output=True, text=True, timeout=600)

    def stop() -> None:
        subprocess.run([str(ASTRAFLOW), "broker", "stop", "--home", str(home)], capture_output=True, timeout=300)

    if started.returncode != 0:
        stop()
        raise RuntimeError(f"broker start failed: {started.stdout[-2000:]}{started.stderr[-2000:]}")
    credentials = home / "security"
    security = {
        "protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "role_credentials": str(credentials),
        "ca_file": str(credentials / "ca.pem"),
    }
    return ",".join(f"127.0.0.1:{port + n}" for n in range(nodes)), security, stop


def local_side(args: argparse.Namespace, layout: dict, work: Path) -> dict:
    """``astraflow run`` of the example on a local cluster of the stack's layout, to ``--versions``."""
    from astraflow.config import write_config_over
    from astraflow.core.metric_names import EVAL_ACCURACY, TRAIN_VERSION

    nodes = len(layout["kafka_nodes"])
    # LocalKafkaCluster: min(nodes, 3) replicas of every partition, min(2, replicas) in sync
    local = {"replication_factor": min(nodes, 3), "min_insync_replicas": min(2, min(nodes, 3))}
    differ = {key: (layout[key], value) for key, value in local.items() if layout[key] != value}
    if differ:
        raise SystemExit(f"a local cluster of {nodes} nodes differs from docker-compose.yml in {differ}")
    load_before = list(os.getloadavg())
    bootstrap, security, stop_cluster = start_cluster(work / "cluster", nodes, args.secure)
    try:
        log = {"backend": "kafka", "bootstrap": bootstrap} | ({"security": security} if security else {})
        config = write_config_over(
            EXAMPLE,
            work / "local.yaml",
            log=log,
            rollout={"producers": layout["rollout_replicas"]},
            stream={"runtime": layout["stream_runtime"]},
            stop={
                "max_minutes": args.minutes,
                "max_versions": args.versions,
                "target_accuracy": None,
                "target_gain": None,
            },
        )
        run_dir = work / "local"
        started = time.monotonic()
        with (work / "launcher.out").open("wb") as out:
            done = subprocess.run(
                [str(ASTRAFLOW), "run", str(config), "--run-dir", str(run_dir), "--no-dashboard"],
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=args.minutes * 60 + 900,
            )
        command_s = time.monotonic() - started
        if done.returncode != 0:
            raise RuntimeError(f"astraflow run failed: {(work / 'launcher.out').read_text()[-3000:]}")
        audit = None
        if args.audit:
            audited = subprocess.run(
                [str(ASTRAFLOW), "audit", str(run_dir), "--json"], capture_output=True, text=True, timeout=1800
            )
            audit = audit_summary(audited)
    finally:
        stop_cluster()
    versions: dict[int, float] = {}
    accuracy: dict[int, float] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        metric = json.loads(line)
        if metric["name"] == TRAIN_VERSION:
            version = int(metric["value"])
            versions[version] = min(metric["wall_s"], versions.get(version, metric["wall_s"]))
        elif metric["name"] == EVAL_ACCURACY:
            accuracy[int(metric["step"])] = metric["value"]
    summary = json.loads((run_dir / "summary.json").read_text())
    return measure(versions, accuracy, args.versions) | {
        "secure": args.secure,
        "kafka_nodes": nodes,
        "rollout_producers": layout["rollout_replicas"],
        "stream_runtime": layout["stream_runtime"],
        "command_seconds": command_s,
        "run_wall_seconds": summary.get("wall_seconds"),
        "restarts": summary.get("restarts", {}),
        "audit": audit,
        "load_before": load_before,
        "load_after": list(os.getloadavg()),
    }


# --- both -----------------------------------------------------------------------------------------


def measure(versions: dict[int, float], accuracy: dict[int, float], target: int) -> dict:
    """Versions per minute from version 1 (the first recorded) to ``target`` (or the last reached
    below it), each version's seconds since the first, and the held-out accuracy."""
    reached = sorted(v for v in versions if v >= 1)
    first = reached[0] if reached else None
    upto = [v for v in reached if v <= target]
    last = upto[-1] if upto else None
    span = versions[last] - versions[first] if reached and last != first else None
    ordered = [accuracy[v] for v in sorted(accuracy) if v > 0]
    base = accuracy.get(0)
    last_two = sum(ordered[-2:]) / len(ordered[-2:]) if ordered else None
    return {
        "versions_reached": reached[-1] if reached else 0,
        "reached_target": bool(reached) and reached[-1] >= target,
        "first_version": first,
        "last_version_counted": last,
        "span_seconds": span,
        "versions_per_minute": 60 * (last - first) / span if span else None,
        "base_accuracy": base,
        "last_two_mean_accuracy": last_two,
        "gain": last_two - base if last_two is not None and base is not None else None,
        "accuracy_by_version": {str(v): accuracy[v] for v in sorted(accuracy)},
        "version_seconds": {str(v): versions[v] - versions[first] for v in reached} if reached else {},
    }


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (progress, accuracy) = plt.subplots(1, 2, figsize=(12, 4.2))
    for index, side in enumerate(("containers", "local")):
        run = result[side]
        rate = run["versions_per_minute"]
        label = f"{side} ({rate:.2f} versions/min)" if rate else side
        times = sorted((t, int(v)) for v, t in run["version_seconds"].items())
        progress.plot([t for t, _ in times], [v for _, v in times], color=f"C{index}", label=label)
        points = sorted((int(v), a) for v, a in run["accuracy_by_version"].items())
        accuracy.plot([v for v, _ in points], [a for _, a in points], "-o", markersize=3, color=f"C{index}", label=side)
    ratio = result["containers_over_local"]["versions_per_minute"]
    variant = "secure" if result["inputs"]["secure"] else "plain"
    progress.set(
        xlabel="seconds since version 1",
        ylabel="weight version",
        title=f"{variant} stack: containers / local " + (f"{ratio:.2f}x" if ratio else "n/a"),
    )
    accuracy.set(xlabel="weight version", ylabel="held-out exact match", title="held-out accuracy")
    progress.legend(fontsize=8)
    accuracy.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", type=int, default=100, help="Versions each side trains (the stack: until then).")
    parser.add_argument(
        "--minutes", type=float, default=40.0, help="Cap of each side's training (a safety net for a stuck run)."
    )
    parser.add_argument("--secure", action="store_true", help="The secure variant, on both sides.")
    parser.add_argument(
        "--project", default="astraflow-bench", help="The stack's compose project (ASTRAFLOW_STACK_PROJECT)."
    )
    parser.add_argument("--poll", type=float, default=10.0, help="Seconds between reads of the stack's version.")
    parser.add_argument("--no-audit", dest="audit", action="store_false", help="Skip `astraflow audit` on both sides.")
    parser.add_argument("--out", type=Path, default=RESULTS / "compose_stack.json")
    parser.add_argument("--keep", type=Path, default=None, help="Keep the local run's directory here.")
    args = parser.parse_args()

    record = begin(EXAMPLE)
    layout = compose_layout()
    print(f"layout: {json.dumps(layout)}", flush=True)
    result = {
        "inputs": vars(args) | {"out": str(args.out), "keep": str(args.keep) if args.keep else None},
        "layout": layout,
        "containers": containers_side(args),
        "local": None,
        "containers_over_local": {"versions_per_minute": None},
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
    }
    containers = result["containers"]
    print(f"containers: {containers['versions_per_minute']} versions/min", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # the stack's side first, so that a failure of the local run does not lose it
    args.out.write_text(json.dumps(result | {"provenance": finish(record)}, indent=2))
    with tempfile.TemporaryDirectory(prefix="compose-stack-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        local = result["local"] = local_side(args, layout, work)
    print(f"local: {local['versions_per_minute']} versions/min", flush=True)
    ratio = (
        containers["versions_per_minute"] / local["versions_per_minute"]
        if containers["versions_per_minute"] and local["versions_per_minute"]
        else None
    )
    result["containers_over_local"] = {"versions_per_minute": ratio}
    result["provenance"] = finish(record)
    args.out.write_text(json.dumps(result, indent=2))
    plot(result, args.out.with_suffix(".png"))
    images = ", ".join(f"{name} {image['size_mb']} MB" for name, image in containers["images"].items())
    print(
        f"{'secure' if args.secure else 'plain'} stack, "
        f"v{containers['first_version']}-v{containers['last_version_counted']}: "
        f"containers {containers['versions_per_minute'] or float('nan'):.2f} versions/min, "
        f"local {local['versions_per_minute'] or float('nan'):.2f} versions/min, "
        f"containers/local {ratio or float('nan'):.2f}; restarts in containers {containers['restarts']}; "
        f"images: {images}"
    )


if __name__ == "__main__":
    main()
