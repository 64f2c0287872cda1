"""Multi-turn episodes survive a producer killed in their middle (``producers/rollout/episode_journal.py``).

The rooms, search and code examples as separate processes (trainer, stream, feeder, one rollout
producer), each on both backends. The producer SIGKILLs itself right after a commit of completed turns
(``rollout.turns_committed#k``, ``core/crashpoints.py``: the second for rooms and search, the first for
code, whose episodes have two turns), which held turns of episodes still going: those are on the
journal, nothing of them on the trajectories topic. Bases warmed up for one step write nonsense,
which every environment answers instead of ending on (an unknown move, a missing ``answer(...)``, a
failing program), so episodes go on to their turn limit. The test reads the journal then, with
nothing running that could write it, and starts another producer. That one must finish each recorded
episode from its last recorded turn: the finished trajectory starts with the recorded tokens, log-probs,
versions and turns byte for byte, lists both producers and one resume, and the second producer's
``rollout.turns_resumed`` counts exactly the recorded policy turns (it generated only the others). Then
``astraflow audit``, from the records alone: nothing lost or trained twice, every episode finished
once, the resumed ones marked, none left unfinished on the journal.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from astraflow.core.crashpoints import ENV as CRASH_ENV
from astraflow.core.crashpoints import RECORD_ENV
from astraflow.core.metric_names import ROLLOUT_TURNS_RESUMED
from astraflow.log import TopicPartition
from astraflow.runtime.attach import decode_snapshot, open_run
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import Metric, Trajectory
from tests.e2e.conftest import ASTRAFLOW, made_once, run_audit, stop_processes, warm_up
from tests.e2e.test_agentic import example_config
from tests.e2e.test_elastic import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
QUICK = {
    "task": {"heldout_size": 16},
    # the policy need not be good, only take turns: one supervised step, then the warm-up's first evaluation
    "warmup": {"max_steps": 1, "eval_every": 1, "target_accuracy": 0.001},
    "rollout": {"group_size": 4, "prompts_per_generation": 2, "threads": 1, "temperature": 1.0},
    "agent": {"tool_workers": 1},
    "train": {"batch_samples": 8},
}
# rooms: a turn of up to 40 tokens mostly ends with eos (10, the example's, mostly ends the episode: "length"),
# so episodes go on until their 640 tokens are spent, ~6 turns; search has 3 turns and code 2
EXAMPLES = {
    "rooms": ({"max_new_tokens": 40}, "rollout.turns_committed#2"),
    "search": ({}, "rollout.turns_committed#2"),
    "code": ({}, "rollout.turns_committed#1"),
}


def quick(example: str, path: Path, **sections: dict | str) -> Path:
    rollout, _ = EXAMPLES[example]
    return example_config(example, path, **{**QUICK, "rollout": {**QUICK["rollout"], **rollout}}, **sections)


@pytest.fixture(scope="session")
def quick_bases(tmp_path_factory: pytest.TempPathFactory):
    """``quick_bases(example)``: a run directory template holding the example's quick base checkpoint."""

    def base(example: str) -> Path:
        with made_once(tmp_path_factory, f"{example}-quick") as (run_dir, made):
            if not made:
                warm_up(quick(example, run_dir / "config.yaml"), run_dir, timeout=600)
        return run_dir

    return base


@pytest.mark.parametrize("backend", ["embedded", "kafka"])
@pytest.mark.parametrize("example", list(EXAMPLES))
def test_a_killed_producers_episodes_finish_from_their_last_recorded_turn(
    example: str, backend: str, quick_bases, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "base").symlink_to(quick_bases(example) / "base")
    run = f"resume-{example}-{backend}-{os.getpid()}"
    log = {"backend": "embedded"}
    if backend == "kafka":
        log = {"backend": "kafka", "bootstrap": request.getfixturevalue("kafka_bootstrap")}
    config = quick(example, tmp_path / "config.yaml", run=run, log={**log, "partitions": 2})
    record = tmp_path / "crash-record"
    record.mkdir()
    logs = tmp_path / "logs"
    logs.mkdir()

    def start(component: str, tag: str, **env: str) -> subprocess.Popen:
        out = (logs / f"{tag}.out").open("wb")
        argv = [str(ASTRAFLOW), component, str(config), "--run-dir", str(run_dir)]
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env})

    processes = {name: start(name, name) for name in ("train", "stream", "feed")}
    processes["rollout-a"] = start("rollout", "rollout-a", **{CRASH_ENV: EXAMPLES[example][1], RECORD_ENV: str(record)})
    try:
        assert processes["rollout-a"].wait(timeout=300) == -9, (logs / "rollout-a.out").read_text()[-3000:]
        with open_run(config, run_dir) as attached:  # nothing runs that could write the journal now
            recorded = newest(attached.log, f"{run}.episodes.main")
        assert recorded, "the killed producer had committed turns of its episodes"
        killed = {r.producer_id for r in recorded.values()}
        assert len(killed) == 1 and all(r.resumes == 0 and r.producers == [] for r in recorded.values())

        processes["rollout-b"] = start("rollout", "rollout-b")
        with open_run(config, run_dir) as attached:
            wait_until(
                lambda: set(recorded) <= {t.trajectory_id for t in trajectories(attached.log, run)},
                300,
                "the second producer to finish the recorded episodes",
            )
    finally:
        stop_processes(processes.values())

    with open_run(config, run_dir) as attached:
        finished = trajectories(attached.log, run)
        turns_resumed = {
            m.labels["instance"]: m.value
            for _, m in decode_snapshot(attached.log, f"{run}.metrics.producer")
            if isinstance(m, Metric) and m.name == ROLLOUT_TURNS_RESUMED
        }
    by_id = {t.trajectory_id: t for t in finished}
    assert len(by_id) == len(finished), "every episode finished once"
    for episode, before in recorded.items():
        after, cut = by_id[episode], before.turns[-1].end
        assert after.response_ids[:cut].tobytes() == before.response_ids.tobytes()
        assert after.behaviour_logprobs[:cut].tobytes() == before.behaviour_logprobs.tobytes()
        assert after.token_versions[:cut].tobytes() == before.token_versions.tobytes()
        assert after.loss_mask[:cut].tobytes() == before.loss_mask.tobytes()
        assert after.turns[: len(before.turns)] == before.turns
        assert after.prompt_ids.tobytes() == before.prompt_ids.tobytes()
        assert after.resumes == 1 and after.producers[0] == before.producer_id
        assert after.producers == [before.producer_id, after.producer_id] and after.producer_id not in killed
    resumer = by_id[next(iter(recorded))].producer_id
    policy_turns = sum(1 for r in recorded.values() for turn in r.turns if turn.role == "policy")
    assert turns_resumed[resumer] == policy_turns  # it took these from the journal and generated the rest

    audited = run_audit(config, "--run-dir", run_dir)
    assert audited.returncode == 0, audited.stdout[-3000:] + audited.stderr[-3000:]
    [main] = json.loads(audited.stdout)["policies"]
    assert main["lost"] == [] and main["trained_twice"] == [] and main["episodes_finished_twice"] == []
    assert main["episodes_resumed"] == len(recorded) and main["episodes_unfinished"] == 0


def newest(log, topic: str) -> dict[str, Trajectory]:
    """The journal's unfinished episodes: the newest record of each key that is not a tombstone."""
    codec, table = Codec(), {}
    reader = log.range_reader()
    try:
        for partition, end in log.end_offsets(topic).items():
            for message in reader.read_range(TopicPartition(topic, partition), 0, end):
                key = message.key.decode()
                if message.value:
                    table[key] = codec.decode(message.value, expect=Trajectory)
                else:
                    table.pop(key, None)
    finally:
        reader.close()
    return table


def trajectories(log, run: str) -> list[Trajectory]:
    return [t for _, t in decode_snapshot(log, f"{run}.trajectories.main") if isinstance(t, Trajectory)]
