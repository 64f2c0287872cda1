#!/usr/bin/env bash
# The compose stack (docker-compose.yml; with --secure, docker-compose.secure.yml over it) built and run
# on this machine: a three-node Kafka cluster and the math example's components, one container each.
#
#   scripts/stack.sh up [--secure]                 build what is missing, start the cluster, wait until
#                                                  it is healthy, then warm-up and the components
#   scripts/stack.sh stop                          stop the run (the components; the evaluator last, after
#                                                  it scored the final version); the cluster keeps running
#   scripts/stack.sh down [--volumes]              stop the run, then remove every container of the stack
#                                                  (and its volumes: the cluster's data and the run directory)
#   scripts/stack.sh build                         only the images
#   scripts/stack.sh run-dir                       the run directory on the host (in the `runs` volume)
#   scripts/stack.sh astraflow stats|audit|... [ARGS]   the host's `astraflow` on the stack's run, through
#                                                  the published ports (.venv/bin/astraflow CMD CONFIG --run-dir DIR)
#   scripts/stack.sh host-config                   that CONFIG: the run's config as the host reaches it
#   scripts/stack.sh compose [--secure] ARGS...    the compose tool on the stack's files (ps, logs train, ...)
#   scripts/stack.sh engine ARGS...                the engine with the stack's settings (ps, images, ...)
#
# The engine: Docker when a daemon answers (the public images, `docker compose`), else podman,
# installed from Debian's packages if missing (rootful; tested with Debian 12's podman 4.3.1). Under
# podman the stack runs with settings of its own, never the user's global ones: CONTAINERS_CONF and
# CONTAINERS_STORAGE_CONF point at files in the stack's cache, which choose the runc runtime (crun
# refuses hosts with hybrid cgroups), file and process limits a host with a low hard limit accepts
# (ASTRAFLOW_STACK_ULIMITS), and an image store in the cache. The compose tool is podman-compose
# (deploy/stack/compose-requirements.txt, pinned), in a virtualenv of its own. podman 4.3 runs no
# healthcheck by itself without systemd, and podman-compose waits for `service_healthy` only on
# podman 4.6+, so `up` starts the Kafka nodes first and runs their healthchecks itself until all pass
# (see up() for the rest of the order).
#
# Images (ASTRAFLOW_STACK_IMAGES=local, the default under podman; `public` under Docker) are built
# from what a machine without an image registry reaches:
#   astraflow-base:bookworm   Debian 12 with Python 3.11 (debootstrap from Debian's mirror), imported
#   astraflow-uv:VERSION      /uv and /uvx of the uv wheel on PyPI (the Dockerfile's UV_VERSION)
#   astraflow:latest          ./Dockerfile with PYTHON_IMAGE and UV_IMAGE set to the two above
#   astraflow-kafka:4.1.1     deploy/stack/Dockerfile.kafka: Debian's Java 17 and the Kafka jars from
#                             Maven Central (deploy/stack/kafka/pom.xml); the compose files take it
#                             through ASTRAFLOW_KAFKA_IMAGE instead of apache/kafka
# Kafka UI is left out (its image comes from Docker Hub only). Everything built is cached in
# ASTRAFLOW_STACK_CACHE (~/.cache/astraflow/stack): the root file system tarball, the image store,
# the jars; a second `up` builds nothing unless the sources changed.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE=${ASTRAFLOW_STACK_CACHE:-$HOME/.cache/astraflow/stack}
PROJECT=${ASTRAFLOW_STACK_PROJECT:-astraflow}
ULIMITS=${ASTRAFLOW_STACK_ULIMITS:-nofile=1024:1024 nproc=1024:1024}
MIRROR=${ASTRAFLOW_STACK_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm
KAFKA_VERSION=4.1.1
UV_VERSION=$(sed -n 's/^ARG UV_VERSION=//p' Dockerfile)
BASE_IMAGE=localhost/astraflow-base:$SUITE
UV_IMAGE=localhost/astraflow-uv:$UV_VERSION
KAFKA_IMAGE=localhost/astraflow-kafka:$KAFKA_VERSION
NODES=(kafka kafka-2 kafka-3)
COMPONENTS=(feed rollout stream train evaluate)
HEALTH_TIMEOUT_S=${ASTRAFLOW_STACK_HEALTH_TIMEOUT_S:-600}

say() { echo "stack: $*" >&2; }
die() { say "$*"; exit 1; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# --- the engine and the compose tool --------------------------------------------------------------

pick_engine() {
    case "${ASTRAFLOW_STACK_ENGINE:-}" in
        docker | podman) ENGINE=$ASTRAFLOW_STACK_ENGINE ;;
        "") if docker info >/dev/null 2>&1; then ENGINE=docker; else ENGINE=podman; fi ;;
        *) die "ASTRAFLOW_STACK_ENGINE is docker or podman, not '$ASTRAFLOW_STACK_ENGINE'" ;;
    esac
    if [ "$ENGINE" = podman ]; then
        IMAGES=${ASTRAFLOW_STACK_IMAGES:-local}
        configure_podman
    else
        IMAGES=${ASTRAFLOW_STACK_IMAGES:-public}
    fi
    if [ "$IMAGES" = local ]; then export ASTRAFLOW_KAFKA_IMAGE=$KAFKA_IMAGE; fi
}

configure_podman() {
    local missing=()
    for tool in podman runc debootstrap; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
    command -v netavark >/dev/null 2>&1 || [ -x /usr/lib/podman/netavark ] || missing+=(netavark aardvark-dns)
    if [ "${#missing[@]}" -gt 0 ]; then
        say "installing ${missing[*]} from Debian's packages (no Docker daemon answers)"
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
    local engine_dir=$CACHE/engine run_root
    if [ "$(id -u)" -eq 0 ]; then run_root=/run/astraflow-stack; else run_root=${XDG_RUNTIME_DIR:-/tmp}/astraflow-stack; fi
    mkdir -p "$engine_dir/networks" "$engine_dir/tmp"
    local ulimits
    ulimits=$(printf '"%s", ' $ULIMITS)
    cat >"$engine_dir/containers.conf" <<EOF
# Written by scripts/stack.sh for the stack's own podman calls (CONTAINERS_CONF); not the user's.
[containers]
default_ulimits = [${ulimits%, }]
[engine]
runtime = "runc"
# builds' temporary files and their cache mounts (uv's downloads), else in /var/tmp
image_copy_tmp_dir = "$engine_dir/tmp"
[network]
network_backend = "netavark"
network_config_dir = "$engine_dir/networks"
EOF
    cat >"$engine_dir/storage.conf" <<EOF
# Written by scripts/stack.sh for the stack's own podman calls (CONTAINERS_STORAGE_CONF); not the user's.
[storage]
driver = "overlay"
graphroot = "$engine_dir/storage"
runroot = "$run_root/storage"
EOF
    export CONTAINERS_CONF=$engine_dir/containers.conf CONTAINERS_STORAGE_CONF=$engine_dir/storage.conf
}

# uv: on PATH, else as a module of python3 (installed with pip), as scripts/setup.sh finds it.
host_uv() {
    if command -v uv >/dev/null 2>&1; then uv "$@"; return; fi
    python3 -m uv --version >/dev/null 2>&1 || python3 -m pip install --quiet --disable-pip-version-check uv
    python3 -m uv "$@"
}

# A virtualenv with the pinned podman-compose and the uv the image is built with.
TOOLS=$CACHE/tools
ensure_tools() {
    local stamp
    stamp="$TOOLS/.installed-$(echo "uv==$UV_VERSION" | cat deploy/stack/compose-requirements.txt - | sha256sum | cut -c1-16)"
    [ -e "$stamp" ] && return
    say "installing the compose tool (deploy/stack/compose-requirements.txt) and uv $UV_VERSION into $TOOLS"
    rm -rf "$TOOLS"
    host_uv venv --quiet --python python3 "$TOOLS"
    host_uv pip install --quiet --python "$TOOLS/bin/python" -r deploy/stack/compose-requirements.txt "uv==$UV_VERSION"
    touch "$stamp"
}

compose() {
    local files=(-f docker-compose.yml)
    if [ "$ENGINE" = podman ]; then
        ensure_tools
        # deploy/stack/compose.podman-secure.yml: the nodes' healthchecks, which podman-compose would merge wrongly
        if [ "$SECURE" = 1 ]; then files+=(-f deploy/stack/compose.podman-secure.yml -f docker-compose.secure.yml); fi
        "$TOOLS/bin/podman-compose" -p "$PROJECT" "${files[@]}" "$@"
        return
    fi
    if [ "$SECURE" = 1 ]; then files+=(-f docker-compose.secure.yml); fi
    if docker compose version >/dev/null 2>&1; then
        docker compose -p "$PROJECT" "${files[@]}" "$@"
    else
        docker-compose -p "$PROJECT" "${files[@]}" "$@"
    fi
}

# --- images ---------------------------------------------------------------------------------------

has_image() { "$ENGINE" image inspect "$1" >/dev/null 2>&1; }

timed() {
    local what=$1 started=$SECONDS
    shift
    "$@"
    say "$what in $((SECONDS - started)) s"
}

base_image() {
    has_image "$BASE_IMAGE" && return
    local tarball=$CACHE/debian-$SUITE-rootfs.tar
    if [ ! -e "$tarball" ]; then
        say "building a Debian $SUITE root file system with Python 3.11 (debootstrap, $MIRROR)"
        local root=$CACHE/rootfs.tmp
        as_root rm -rf "$root"
        as_root debootstrap --variant=minbase --include=python3,ca-certificates "$SUITE" "$root" "$MIRROR" >/dev/null
        as_root rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
        as_root tar -C "$root" --numeric-owner -cf "$tarball.tmp" .
        as_root rm -rf "$root"
        mv "$tarball.tmp" "$tarball"
    fi
    "$ENGINE" import -q --change 'CMD ["/bin/bash"]' "$tarball" "$BASE_IMAGE" >/dev/null
}

uv_image() {
    has_image "$UV_IMAGE" && return
    ensure_tools
    local dir
    dir=$(mktemp -d)
    cp "$TOOLS/bin/uv" "$TOOLS/bin/uvx" "$dir/"
    tar -C "$dir" --owner=0 --group=0 -cf - uv uvx | "$ENGINE" import -q - "$UV_IMAGE" >/dev/null
    rm -rf "$dir"
}

# The build context of deploy/stack/Dockerfile.kafka: the jars Maven copies and the image's scripts.
kafka_image() {
    local context=$CACHE/kafka-context pom=deploy/stack/kafka/pom.xml
    local fetched
    fetched="$context/fetched-$KAFKA_VERSION-$(sha256sum "$pom" | cut -c1-16)"
    if [ ! -e "$fetched" ]; then
        command -v mvn >/dev/null 2>&1 || scripts/ensure-system.sh
        say "fetching the Kafka $KAFKA_VERSION jars from Maven Central ($pom)"
        rm -rf "$context"
        mvn -q -B -Dstyle.color=never -f "$pom" dependency:copy-dependencies \
            -DoutputDirectory="$context/libs" -DincludeScope=runtime -Dkafka.version="$KAFKA_VERSION"
        touch "$fetched"
    fi
    cp deploy/stack/kafka/kafka-run deploy/stack/kafka/kafka-tool deploy/stack/kafka/log4j2.xml \
        deploy/stack/kafka/tools-log4j2.xml "$context/"
    "$ENGINE" build -q --build-arg BASE_IMAGE="$BASE_IMAGE" -f deploy/stack/Dockerfile.kafka \
        -t "$KAFKA_IMAGE" "$context" >/dev/null
}

# The host's trust for the build's downloads from PyPI (SSL_CERT_FILE, where a proxy re-signs TLS):
# mounted into the build's steps and named by a build argument, so the image keeps neither.
astraflow_image() {
    local trust=()
    local bundle=${ASTRAFLOW_STACK_BUILD_CA:-${SSL_CERT_FILE:-}}
    if [ -n "$bundle" ] && [ -f "$bundle" ] && [ "$ENGINE" = podman ]; then
        trust=(-v "$bundle:/tmp/build-ca.pem:ro" --build-arg SSL_CERT_FILE=/tmp/build-ca.pem)
    fi
    "$ENGINE" build -q "${trust[@]}" --build-arg PYTHON_IMAGE="$BASE_IMAGE" --build-arg UV_IMAGE="$UV_IMAGE" \
        -t astraflow:latest . >/dev/null
    # what a rebuild replaced (several GB), in the stack's own store only: the old image, then each
    # of its layers that no other image is built on, until none is left
    if [ "$ENGINE" = podman ]; then
        while [ -n "$("$ENGINE" image prune -f)" ]; do :; done
    fi
}

build() {
    mkdir -p "$CACHE"
    if [ "$IMAGES" = public ]; then
        timed "built astraflow:latest" compose build
        return
    fi
    timed "base image $BASE_IMAGE ready" base_image
    timed "uv image $UV_IMAGE ready" uv_image
    timed "Kafka image $KAFKA_IMAGE ready" kafka_image
    timed "AstraFlow image astraflow:latest ready" astraflow_image
}

# --- up and down ----------------------------------------------------------------------------------

service_containers() {
    "$ENGINE" ps -a -q --filter "label=com.docker.compose.project=$PROJECT" --filter "label=com.docker.compose.service=$1"
}

wait_healthy() {
    local deadline=$((SECONDS + HEALTH_TIMEOUT_S)) node id waiting
    while :; do
        waiting=()
        for node in "${NODES[@]}"; do
            id=$(service_containers "$node")
            [ -n "$id" ] || die "no container for $node"
            "$ENGINE" healthcheck run "$id" >/dev/null 2>&1 || waiting+=("$node")
        done
        [ "${#waiting[@]}" -eq 0 ] && return
        [ "$SECONDS" -lt "$deadline" ] || die "not healthy after ${HEALTH_TIMEOUT_S}s: ${waiting[*]} (scripts/stack.sh compose logs ${waiting[0]})"
        sleep 5
    done
}

# Start one-shot services and wait for each to exit 0 (depends_on: service_completed_successfully).
one_shots() {
    compose up -d --no-build --no-deps "$@" >/dev/null
    local service id code
    for service in "$@"; do
        for id in $(service_containers "$service"); do
            code=$("$ENGINE" wait "$id")
            [ "$code" = 0 ] || die "$service exited with $code (scripts/stack.sh compose logs $service)"
        done
    done
}

# Under podman the script keeps the order the files' depends_on ask for, a stage at a time, each
# started with --no-deps: podman 4.3 cannot wait for `service_healthy`, and the --requires that
# podman-compose turns depends_on into would keep a component that exits on an error from being
# restarted (`restart: on-failure`), its warm-up dependency having exited. Docker follows the files.
up() {
    build
    if [ "$ENGINE" = docker ]; then
        if [ "$IMAGES" = public ]; then compose up -d; else compose up -d --no-build "${NODES[@]}" "${COMPONENTS[@]}"; fi
        return
    fi
    local started=$SECONDS
    if [ "$SECURE" = 1 ]; then one_shots security; fi
    compose up -d --no-build --no-deps "${NODES[@]}" >/dev/null
    wait_healthy
    say "Kafka nodes healthy after $((SECONDS - started)) s"
    if [ "$SECURE" = 1 ]; then one_shots quotas grant warmup; else one_shots warmup; fi
    say "warm-up done after $((SECONDS - started)) s"
    compose up -d --no-build --no-deps "${COMPONENTS[@]}" >/dev/null
    say "up after $((SECONDS - started)) s; the host reaches the cluster at localhost:9094,localhost:9095,localhost:9096"
    say "run directory: $(run_dir)"
}

# Stop the run as `astraflow run` stops one: SIGTERM to the components, which finish their step and
# flush, and the evaluator last, which scores the final version first. The cluster keeps running.
stop_run() {
    local service id ids=() evaluators
    for service in "${COMPONENTS[@]}"; do
        [ "$service" = evaluate ] && continue
        while read -r id; do
            if [ -n "$id" ]; then ids+=("$id"); fi
        done < <("$ENGINE" ps -q --filter "label=com.docker.compose.project=$PROJECT" --filter "label=com.docker.compose.service=$service")
    done
    if [ "${#ids[@]}" -gt 0 ]; then "$ENGINE" stop -t 30 "${ids[@]}" >/dev/null; fi
    evaluators=$("$ENGINE" ps -q --filter "label=com.docker.compose.project=$PROJECT" --filter "label=com.docker.compose.service=evaluate")
    if [ -n "$evaluators" ]; then "$ENGINE" stop -t 180 $evaluators >/dev/null; fi
}

down() {
    stop_run
    local args=(down --remove-orphans)
    if [ "$VOLUMES" = 1 ]; then args+=(-v); fi
    compose "${args[@]}" >/dev/null 2>&1 || true
    # whatever the files named no longer (a secure stack taken down without --secure, say)
    local left
    left=$("$ENGINE" ps -a -q --filter "label=com.docker.compose.project=$PROJECT")
    if [ -n "$left" ]; then
        if [ "$VOLUMES" = 1 ]; then "$ENGINE" rm -f -v $left >/dev/null; else "$ENGINE" rm -f $left >/dev/null; fi
    fi
    if [ "$VOLUMES" = 1 ]; then
        left=$("$ENGINE" volume ls -q --filter "label=com.docker.compose.project=$PROJECT")
        if [ -n "$left" ]; then "$ENGINE" volume rm -f $left >/dev/null; fi
    fi
    [ -z "$("$ENGINE" ps -q --filter "label=com.docker.compose.project=$PROJECT")" ] || die "containers still run"
    say "down: no container of $PROJECT is left"
}

run_dir() {
    echo "$("$ENGINE" volume inspect --format '{{.Mountpoint}}' "${PROJECT}_runs")/math"
}

# The run's config as the host sees it: the services' examples/math/config.yaml on the Kafka backend at
# the published ports (the services give --backend and --bootstrap on their command lines instead);
# on the secure stack logged in as the `analysis` principal, from its volume (it reads, never writes).
host_config() {
    ensure_tools
    local config=$CACHE/math.host.yaml credentials=""
    if "$ENGINE" volume inspect "${PROJECT}_security-analysis" >/dev/null 2>&1; then
        credentials=$("$ENGINE" volume inspect --format '{{.Mountpoint}}' "${PROJECT}_security-analysis")
    fi
    "$TOOLS/bin/python" - examples/math/config.yaml "$config" "$credentials" <<'EOF'
import sys

import yaml

source, target, credentials = sys.argv[1:]
config = yaml.safe_load(open(source))
config["log"].update(backend="kafka", bootstrap="localhost:9094,localhost:9095,localhost:9096")
if credentials:
    config["log"]["security"] = {
        "protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "role_credentials": credentials,
        "ca_file": f"{credentials}/ca.pem",
    }
with open(target, "w") as out:
    out.write(f"# {source} as the host reaches the stack (written by scripts/stack.sh)\n")
    yaml.safe_dump(config, out, sort_keys=False)
EOF
    echo "$config"
}

# `astraflow COMMAND` of the host's .venv on the stack's run: stats, audit, report ...
host_astraflow() {
    local command=${1:?which astraflow command: stats, audit, report ...}
    shift
    [ -x .venv/bin/astraflow ] || scripts/setup.sh
    .venv/bin/astraflow "$command" "$(host_config)" --run-dir "$(run_dir)" "$@"
}

# --- command line ---------------------------------------------------------------------------------

# One function, called on the last line: bash has read the whole file before anything runs, so an
# edit of the script while a stack comes up (which takes minutes) cannot change what this run does.
main() {
    SECURE=0
    VOLUMES=0
    local command=${1:-}
    [ -n "$command" ] || die "usage: scripts/stack.sh up|stop|down|build|run-dir|astraflow|host-config|compose|engine [...] (see the top of the script)"
    shift
    if [ "$command" != engine ] && [ "$command" != astraflow ]; then
        while [ $# -gt 0 ]; do
            case "$1" in
                --secure) SECURE=1 ;;
                --volumes) VOLUMES=1 ;;
                *) break ;;
            esac
            shift
        done
    fi
    pick_engine
    case "$command" in
        up) up ;;
        stop) stop_run ;;
        down) down ;;
        build) build ;;
        run-dir) run_dir ;;
        astraflow) host_astraflow "$@" ;;
        host-config) host_config ;;
        compose) compose "$@" ;;
        engine) "$ENGINE" "$@" ;;
        *) die "no command '$command': up, stop, down, build, run-dir, astraflow, host-config, compose or engine" ;;
    esac
}

main "$@"; exit
