#!/usr/bin/env bash
# What the tests need from the machine itself, installed from Debian's packages when it is missing:
# Java 17 (a JDK: one integration test runs a Java source file) and Maven for the local Kafka broker
# (Maven fetches its jars), bubblewrap for the
# code sandbox's first backend (tests/unit/test_sandbox.py runs every backend; under CI=true one
# that does not work fails the run instead of being skipped), and a docker compose, which
# tests/unit/test_compose_secure.py runs to merge the compose files (`config` needs no engine):
# the plugin where Docker is installed, else Debian's docker-compose; and a C compiler, which builds
# the weights' encoding kernel (astraflow/weights/kernel.py; tests/unit/test_weight_kernel.py).
set -euo pipefail
missing=()
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jdk-headless)
command -v mvn >/dev/null 2>&1 || missing+=(maven)
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
command -v cc >/dev/null 2>&1 || command -v gcc >/dev/null 2>&1 || missing+=(gcc)
# docker-compose alone: it recommends docker.io, an engine the compose check does not use.
compose=()
docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null 2>&1 || compose=(docker-compose)
if [ "${#missing[@]}" -eq 0 ] && [ "${#compose[@]}" -eq 0 ]; then
    exit 0
fi
echo "setup: installing ${missing[*]} ${compose[*]} (the local Kafka broker, the code sandbox, compose checks, the weights kernel)" >&2
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
if [ "${#missing[@]}" -gt 0 ]; then
    $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if [ "${#compose[@]}" -gt 0 ]; then
    $SUDO apt-get install -y -qq --no-install-recommends "${compose[@]}" >/dev/null
fi
