#!/usr/bin/env bash
# What the tests need from the machine itself, installed from Debian's packages when it is missing:
# Java 17 and Maven for the local Kafka broker (Maven fetches its jars), and bubblewrap for the
# code sandbox's first backend (tests/unit/test_sandbox.py runs every backend; under CI=true one
# that does not work fails the run instead of being skipped).
set -euo pipefail
missing=()
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || missing+=(maven)
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
if [ "${#missing[@]}" -eq 0 ]; then
    exit 0
fi
echo "setup: installing ${missing[*]} (the local Kafka broker and the code sandbox)" >&2
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
