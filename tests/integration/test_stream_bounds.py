"""Records that used to crash-loop, freeze or poison a stream processor, written into a live one
(Reliability IV, scenarios 2, 3 and 5).

A real ``astraflow stream`` process (native runtime, embedded log, tiny model) reads, in order:

2. a group whose four valid trajectories each carry a 4.5 MiB ``trajectory_id``: together more than the
   16 MiB a feedback record may have, which the stream could never commit (it exited, re-read the same
   poll and exited again until the launcher gave up);
3. 200 trajectories whose token versions name version 10^9: each waited ``VERSION_WAIT_S`` inside the
   open transaction, 400 s in all, while nothing else moved;
5. a group with a reward component of 1e300 under ``reward_terms`` + ``reward_norm``: the running sum
   of squares became ``inf`` and every later group normalised to NaN or 0;

then good groups. Each bad record must be dead-lettered with a reason naming its field, the process
must stay up, and the good groups after them must come out as samples with finite advantages, all
within ``DEADLINE_S`` (what the old code took 400 s over is bounded by one poll's wait now).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import yaml

from astraflow.runtime.attach import decode_snapshot
from astraflow.schemas.records import TrainSample
from tests.integration.test_bad_records import GROUP, Pipeline, trajectory

MiB = 1024 * 1024
DEADLINE_S = 90.0
FUTURE = 10**9
GOOD = 4


def test_oversized_ids_future_versions_and_huge_components_neither_stop_nor_freeze_nor_poison(tmp_path: Path) -> None:
    pipeline = Pipeline(tmp_path, "native", {"backend": "embedded"})
    config = yaml.safe_load(pipeline.config.read_text())
    config["stream"]["pipeline"] = [
        {"op": "staleness"},
        {"op": "reward_terms", "weights": {"found": 0.5}},
        {"op": "reward_norm"},
        {"op": "grpo"},
        {"op": "zero_variance"},
    ]
    pipeline.config.write_text(yaml.safe_dump(config))
    try:
        pipeline.start("stream")
        trajectories, samples = pipeline.topics.trajectories("main"), pipeline.topics.samples("main")
        big = [trajectory("t-big-ids", i, trajectory_id=f"{i}" + "x" * (9 * MiB // 2)) for i in range(GROUP)]
        pipeline.write(trajectories, big)
        future = np.array([0, FUTURE, 0], dtype=np.int32)
        pipeline.write(
            trajectories,
            [trajectory(f"t-future{g}", i, token_versions=future) for g in range(50) for i in range(GROUP)],
        )
        huge = [trajectory("t-huge", 0, reward_components={"found": 1e300})]
        pipeline.write(trajectories, huge + [trajectory("t-huge", i) for i in range(1, GROUP)])
        pipeline.write(trajectories, [trajectory(f"t-good{g}", i) for g in range(GOOD) for i in range(GROUP)])

        deadline = time.monotonic() + DEADLINE_S
        emitted: list[TrainSample] = []
        while len(emitted) < GOOD * GROUP:
            assert pipeline.processes["stream"].poll() is None, pipeline.output("stream")
            assert time.monotonic() < deadline, (
                f"{len(emitted)} samples after {DEADLINE_S} s: {pipeline.output('stream')}"
            )
            time.sleep(0.5)
            emitted = [record for _, record in decode_snapshot(pipeline.log, samples)]
        pipeline.stop()
        reasons = [letter.reason for letter in pipeline.dead_letters()]
    finally:
        pipeline.close()

    assert sorted(s.trajectory.group_id for s in emitted) == sorted(
        f"t-good{g}" for g in range(GOOD) for _ in range(GROUP)
    )
    assert all(np.isfinite(s.advantage) and s.advantage != 0 for s in emitted)
    oversized = [
        r for r in reasons if r.endswith("chars): trajectory_id: 4718593 bytes, more than the 256 an id may have")
    ]
    assert len(oversized) == GROUP, [r[:200] for r in reasons]
    from_the_future = [r for r in reasons if f"token_versions: version {FUTURE} is above the newest published" in r]
    assert len(from_the_future) == 50 * GROUP
    assert any("reward_components: 'found' is 1e+300, beyond stream.max_abs_reward" in r for r in reasons)
