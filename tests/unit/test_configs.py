"""Every example config loads, and every option of the learner's ``PolicyStepConfig`` is a YAML key.

The learner's settings come from the ``train`` section (``training.learner.step_config``): its top
fields under the YAML names they have always had, ``train.loss`` as it is. The table below names
the key of every ``PolicyStepConfig`` field; a field added to the learner without a key fails here.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from astraflow.config import KlConfig, RunConfig, TrainConfig, dump_config, load_config, parse_config
from astraflow.core.errors import ConfigError
from astraflow.training.learner import step_config
from astraflow.training.step import PolicyStepConfig

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXAMPLE_CONFIGS = sorted(EXAMPLES.rglob("*.yaml"))


def test_there_are_examples() -> None:
    assert len(EXAMPLE_CONFIGS) >= 7, EXAMPLE_CONFIGS


@pytest.mark.parametrize("path", EXAMPLE_CONFIGS, ids=lambda path: str(path.relative_to(EXAMPLES)))
def test_example_loads_and_its_saved_config_loads_again(path: Path, tmp_path: Path) -> None:
    config = load_config(path)
    dump_config(config, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == config
    for name in config.policy_names():
        policy = config.for_policy(name)
        steps = step_config(policy.train, policy.rollout)
        assert steps.max_tokens == policy.rollout.max_new_tokens
        assert steps.temperature == policy.rollout.temperature


# (YAML key, value written, PolicyStepConfig field, value the learner gets)
KEYS = [
    ("train.lr", 0.01, "lr", 0.01),
    ("train.lr_warmup_versions", 3, "lr_warmup_steps", 3),
    ("train.lr_decay_versions", 40, "lr_decay_steps", 40),
    ("train.min_lr_ratio", 0.5, "min_lr_ratio", 0.5),
    ("train.weight_decay", 0.01, "weight_decay", 0.01),
    ("train.max_grad_norm", 0.3, "max_grad_norm", 0.3),
    ("train.clip_low", 0.1, "eps_low", 0.1),
    ("train.clip_high", 0.28, "eps_high", 0.28),
    ("rollout.temperature", 0.7, "temperature", 0.7),
    ("train.loss.betas", [0.8, 0.95], "betas", (0.8, 0.95)),
    ("train.loss.decoupled", False, "decoupled", False),
    ("train.loss.max_is_weight", 5.0, "max_is_weight", 5.0),
    ("train.loss.aggregation", "seq-mean-token-sum-norm", "aggregation", "seq-mean-token-sum-norm"),
    ("train.loss.max_tokens", 64, "max_tokens", 64),
    ("rollout.max_new_tokens", 9, "max_tokens", 9),
    ("train.loss.micro_batch_size", 16, "micro_batch_size", 16),
    ("train.kl", {"coef": 0.05, "estimator": "k2"}, "kl", KlConfig(coef=0.05, estimator="k2")),
]


def _nested(dotted: str, value: object) -> dict:
    head, _, rest = dotted.partition(".")
    return {head: _nested(rest, value) if rest else value}


def test_every_learner_option_has_a_yaml_key() -> None:
    assert {field for _, _, field, _ in KEYS} == {field.name for field in dataclasses.fields(PolicyStepConfig)}


@pytest.mark.parametrize(("key", "written", "field", "learned"), KEYS, ids=[row[0] for row in KEYS])
def test_yaml_key_reaches_the_learner(key: str, written: object, field: str, learned: object) -> None:
    config = parse_config(_nested(key, written))
    steps = step_config(config.train, config.rollout)
    assert getattr(steps, field) == learned
    assert learned != getattr(PolicyStepConfig(), field)  # the key changed something


def test_an_empty_train_section_trains_with_the_learners_defaults() -> None:
    config = RunConfig()
    assert config.train == TrainConfig()
    assert step_config(config.train, config.rollout) == PolicyStepConfig(max_tokens=config.rollout.max_new_tokens)


def test_a_policy_overrides_one_loss_field_and_inherits_the_others() -> None:
    config = load_config(
        EXAMPLES / "solver_verifier" / "config.yaml",
        {"train.loss.max_is_weight": 3.0, "policies.verifier.train.loss.aggregation": "seq-mean-token-mean"},
    )
    solver, verifier = (config.for_policy(name).train.loss for name in ("solver", "verifier"))
    assert (solver.aggregation, solver.max_is_weight) == ("token-mean", 3.0)
    assert (verifier.aggregation, verifier.max_is_weight) == ("seq-mean-token-mean", 3.0)


@pytest.mark.parametrize(
    ("loss", "names"),
    [
        ({"aggregation": "token-sum"}, "train.loss.aggregation"),
        ({"max_tokens": 0}, "train.loss.max_tokens"),
        ({"max_is_weight": 0.5}, "train.loss.max_is_weight"),
        ({"betas": [0.9, 1.0]}, "train.loss.betas.1"),
        ({"betas": [0.9]}, "train.loss.betas"),
        ({"micro_batch_size": 0}, "train.loss.micro_batch_size"),
        ({"eps_low": 0.1}, "train.loss.eps_low"),
    ],
)
def test_bad_loss_option_names_the_field(loss: dict, names: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"train": {"loss": loss}})
    assert names in str(info.value)
