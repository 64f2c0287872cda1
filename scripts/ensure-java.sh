#!/usr/bin/env bash
# The Kafka broker used by the tests runs on Java 17 from jars that Maven fetches.
# Install both from Debian's packages when the machine lacks them.
set -euo pipefail
if command -v java >/dev/null 2>&1 && command -v mvn >/dev/null 2>&1; then
    exit 0
fi
echo "setup: installing Java 17 and Maven for the local Kafka broker" >&2
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq openjdk-17-jre-headless maven >/dev/null
