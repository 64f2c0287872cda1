"""A consumer-group member in its own process, for the multi-process conformance test.

``python -m tests.integration.group_member TARGET_JSON TOPIC GROUP SESSION_S OUT`` opens the log
that ``TARGET_JSON`` (``open_log`` keyword arguments) names, subscribes to ``TOPIC`` in ``GROUP``
and polls until it is killed. It appends one JSON line per event to ``OUT``:
``{"assignment": [partition, ...]}`` whenever its assignment changes, and
``{"records": [[partition, offset, value], ...]}`` for every non-empty poll, written *before*
the records are committed, as an at-least-once component would, and ``{"commit_rejected": why}``
when a rebalance took a partition away before the commit (its records are read again elsewhere).
"""

from __future__ import annotations

import json
import sys

from astraflow.core.errors import LogError
from astraflow.log import open_log


def main(target: str, topic: str, group_id: str, session_s: str, out_path: str) -> None:
    with open(out_path, "a", buffering=1) as out, open_log(**json.loads(target)) as log:
        consumer = log.consumer(group_id, session_timeout_s=float(session_s))
        consumer.subscribe([topic])
        assigned: list[int] | None = None
        while True:
            records = consumer.poll(max_records=100, timeout=0.2)
            now = sorted(tp.partition for tp in consumer.assignment())
            if now != assigned:
                assigned = now
                out.write(json.dumps({"assignment": now}) + "\n")
            if records:
                out.write(json.dumps({"records": [[m.partition, m.offset, m.value.decode()] for m in records]}) + "\n")
                try:
                    consumer.commit()
                except LogError as exc:
                    out.write(json.dumps({"commit_rejected": str(exc)}) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
