"""The Apache Kafka broker's jars, resolved from Maven Central once and cached.

``kafka-broker.pom.xml`` (package data) names the broker and its log4j2 binding; Maven copies
their runtime closure into one folder that ``java -cp 'DIR/*'`` runs. Maven's own repository
(``~/.m2``) keeps the downloads, so fetching into a second folder is offline and takes seconds.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import tempfile
import time
from importlib import resources
from pathlib import Path

from astraflow.core.errors import BrokerError

logger = logging.getLogger(__name__)

KAFKA_VERSION = "4.1.1"
_POM = "kafka-broker.pom.xml"
_FETCH_TIMEOUT_S = 900.0


def fetch_jars(libs_dir: Path, version: str = KAFKA_VERSION) -> Path:
    """Fill ``libs_dir`` with Kafka ``version``'s jars unless it holds them; return it.

    Maven writes into a temporary sibling that is renamed at the end, so an interrupted fetch
    never leaves a half-filled ``libs_dir`` behind, and two concurrent fetches both succeed.
    """
    if any(libs_dir.glob("kafka_2.13-*.jar")):
        return libs_dir
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BrokerError("Maven ('mvn') is not on PATH; install Maven 3.8+ to fetch the Kafka jars")
    libs_dir.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    logger.info("fetching Apache Kafka %s jars from Maven Central into %s", version, libs_dir)
    with tempfile.TemporaryDirectory(dir=libs_dir.parent, prefix=".fetch-") as work:
        pom = Path(work) / "pom.xml"
        pom.write_bytes(resources.files(__package__).joinpath(_POM).read_bytes())
        out = Path(work) / "libs"
        cmd = [
            mvn,
            "-q",
            "-B",
            "-Dstyle.color=never",
            "-f",
            str(pom),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={out}",
            "-DincludeScope=runtime",
            f"-Dkafka.version={version}",
        ]
        try:
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=_FETCH_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            raise BrokerError(f"Maven did not fetch the Kafka jars within {_FETCH_TIMEOUT_S:.0f}s") from exc
        if result.returncode != 0:
            output = "\n".join((result.stdout + result.stderr).strip().splitlines()[-40:])
            raise BrokerError(f"Maven could not fetch Kafka {version}:\n{output}")
        try:
            out.rename(libs_dir)
        except OSError:
            if not libs_dir.is_dir():  # otherwise a concurrent fetch won the race
                raise
    logger.info("fetched %d jars in %.1fs", len(list(libs_dir.glob("*.jar"))), time.monotonic() - started)
    return libs_dir
