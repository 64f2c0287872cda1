"""``stream.pipeline`` and ``stream.curator`` in YAML: the default pipeline, and errors that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from astraflow.config import dump_config, load_config, parse_config
from astraflow.core.errors import ConfigError
from astraflow.streams.operators.pipeline import build_pipeline

EXAMPLE = """
stream:
  max_staleness: 4
  pipeline:
    - {op: staleness}
    - {op: response_length, min_tokens: 1, max_tokens: 512}
    - {op: duplicate, remember: 50000}
    - {op: reward_norm, clip: 5.0}
    - {op: rloo}
    - {op: zero_variance}
    - {op: replay, ratio: 0.3, capacity: 64, selector: uniform, seed: 1}
    - {op: edf}
  curator: {type: greso, p_easy: 0.5, p_hard: 0.5, adapt_every: 32}
"""


def test_yaml_pipeline_builds_in_order(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(EXAMPLE)
    config = load_config(path)
    pipeline = build_pipeline(config.stream)
    assert [op.name for op in pipeline.operators] == [
        "staleness",
        "response_length",
        "duplicate",
        "reward_norm",
        "rloo",
        "zero_variance",
    ]
    assert [m.name for m in pipeline.mixers] == ["replay"] and pipeline.ordering.name == "edf"
    assert pipeline.max_staleness == 4 and pipeline.operators[0].max_staleness == 4
    assert config.stream.replay_ratio == 0.3 and config.stream.curator.adapt_every == 32


@pytest.mark.parametrize(
    ("stream", "names"),
    [
        ({}, ["staleness", "grpo", "zero_variance"]),
        ({"advantage": "rloo"}, ["staleness", "rloo", "zero_variance"]),
        ({"drop_zero_variance": False}, ["staleness", "grpo"]),
        ({"pipeline": [{"op": "staleness", "max_staleness": 0}, {"op": "dr_grpo"}]}, ["staleness", "dr_grpo"]),
    ],
)
def test_default_pipeline_from_the_legacy_fields(stream: dict, names: list[str]) -> None:
    pipeline = build_pipeline(parse_config({"stream": stream}).stream)
    assert [op.name for op in pipeline.operators] == names
    assert pipeline.mixers == [] and pipeline.ordering is None


def test_staleness_override_sets_the_deadline() -> None:
    stream = parse_config({"stream": {"pipeline": [{"op": "staleness", "max_staleness": 0}, {"op": "grpo"}]}}).stream
    assert build_pipeline(stream).max_staleness == 0 and stream.max_staleness == 2


def pipeline(*ops: dict) -> dict:
    return {"stream": {"pipeline": list(ops)}}


GRPO = {"op": "grpo"}


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        (pipeline({"op": "ppo"}), "stream.pipeline.0: Input tag 'ppo'"),
        (pipeline(GRPO, {"op": "replay", "ratoi": 0.3}), "stream.pipeline.1.replay.ratoi: Extra inputs"),
        (pipeline(GRPO, {"op": "replay", "ratio": 0.95}), "stream.pipeline.1.replay.ratio"),
        (pipeline(GRPO, {"op": "replay", "selector": "oldest"}), "stream.pipeline.1.replay.selector"),
        (pipeline({"op": "staleness", "max_staleness": -1}, GRPO), "stream.pipeline.0.staleness.max_staleness"),
        (
            pipeline(GRPO, {"op": "response_length", "min_tokens": 9, "max_tokens": 3}),
            "max_tokens (3) is below min_tokens (9)",
        ),
        (pipeline(GRPO, {"op": "reward_range"}), "stream.pipeline.1.reward_range: Value error, set low, high or both"),
        (pipeline({"op": "zero_variance"}), "stream: Value error, pipeline: needs exactly one advantage operator"),
        (
            pipeline(GRPO, {"op": "rloo"}),
            "needs exactly one advantage operator (grpo, dr_grpo, rloo, reinforce_pp, sft), got ['grpo', 'rloo']",
        ),
        (pipeline(GRPO, {"op": "reward_norm"}), "reward_norm must come before grpo"),
        (pipeline({"op": "edf"}, GRPO), "group operators first, then mixers, then one ordering"),
        (pipeline(GRPO, {"op": "fifo"}, {"op": "edf"}), "at most one ordering"),
        (pipeline(GRPO, {"op": "duplicate"}, {"op": "duplicate"}), "operator 'duplicate' appears 2 times"),
        (
            {"stream": {"drop_zero_variance": False, "pipeline": [GRPO]}},
            "drop_zero_variance: only for the default pipeline",
        ),
        ({"stream": {"advantage": "ppo"}}, "stream.advantage"),
        ({"stream": {"curator": {"type": "top_k"}}}, "stream.curator: Input tag 'top_k'"),
        (
            {"stream": {"curator": {"type": "filter_solved", "threshold": 1.5}}},
            "stream.curator.filter_solved.threshold",
        ),
        ({"stream": {"curator": {"type": "greso", "p_easy": 0.01}}}, "need p_min (0.05) <= p_easy, p_hard <= p_max"),
    ],
)
def test_bad_stream_config_names_the_field(raw: dict, names: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert names in str(info.value)


def test_offline_source_builds_a_mixer() -> None:
    stream = parse_config(
        pipeline(GRPO, {"op": "offline", "topic": "old.trajectories.main", "weight": 0.2, "loop": True})
    ).stream
    (mixer,) = build_pipeline(stream).offline
    assert (mixer.topic, mixer.weight, mixer.loop, mixer.source) == ("old.trajectories.main", 0.2, True, None)


def test_saved_config_loads_again(tmp_path: Path) -> None:
    source = tmp_path / "run.yaml"
    source.write_text(EXAMPLE)
    config = load_config(source)
    dump_config(config, tmp_path / "resolved.yaml")
    assert load_config(tmp_path / "resolved.yaml") == config
    plain = parse_config({})
    dump_config(plain, tmp_path / "plain.yaml")
    assert load_config(tmp_path / "plain.yaml") == plain
