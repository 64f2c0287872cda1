"""The addition dataset is deterministic and its reward scores malformed output 0 but never hides a crash."""

from __future__ import annotations

from pathlib import Path

import pytest

from astraflow.core.errors import RewardError
from astraflow.tasks.arithmetic import addition_problems, exact_match_reward
from astraflow.tasks.base import read_jsonl, write_jsonl


@pytest.mark.parametrize(
    ("response", "answer", "reward"),
    [
        ("47", "47", 1.0),
        ("47\n", "47", 1.0),
        ("47\n12", "47", 1.0),
        (" 47 ", "47", 1.0),
        ("147", "147", 1.0),
        ("48", "47", 0.0),
        ("047", "47", 0.0),
        ("4 7", "47", 0.0),
        ("47+1", "47", 0.0),
        ("", "47", 0.0),
        ("\n47", "47", 0.0),
    ],
)
def test_exact_match_reward(response: str, answer: str, reward: float) -> None:
    assert exact_match_reward(response, answer) == reward


@pytest.mark.parametrize(("response", "answer"), [(None, "47"), ("47", None), (47, "47")])
def test_reward_on_bad_input_raises_instead_of_scoring_zero(response: object, answer: object) -> None:
    with pytest.raises(RewardError):
        exact_match_reward(response, answer)  # type: ignore[arg-type]


def test_split_is_deterministic_disjoint_and_complete() -> None:
    train, heldout = addition_problems(seed=3, heldout_size=500)
    again_train, again_heldout = addition_problems(seed=3, heldout_size=500)
    assert (train, heldout) == (again_train, again_heldout)
    assert len(heldout) == 500 and len(train) == 90 * 90 - 500
    assert not {p.prompt_id for p in train} & {p.prompt_id for p in heldout}
    assert addition_problems(seed=4, heldout_size=500)[1] != heldout
    problem = next(p for p in train + heldout if p.prompt_id == "add-12-35")
    assert (problem.prompt, problem.answer) == ("12+35=", "47")


def test_jsonl_round_trip(tmp_path: Path) -> None:
    _, heldout = addition_problems(seed=0, heldout_size=20)
    path = write_jsonl(tmp_path / "data" / "heldout.jsonl", heldout)
    assert read_jsonl(path) == heldout
    assert path.read_text().splitlines()[0].startswith('{"prompt_id": ')
