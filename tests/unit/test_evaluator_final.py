"""The evaluator's last score is of the weights the run ends with (``eval.final``).

With ``eval.every_versions`` above 1 most versions are taken in and skipped as not due; the one a
run ends on is usually among them. On a stop the evaluator must still score it, and score it
from its own weights, not from the last version it evaluated.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from astraflow.consumers.evaluators import policy as evaluator_module
from astraflow.consumers.evaluators.policy import Evaluator
from astraflow.core.metric_names import EVAL_ACCURACY


class ScriptedFollower:
    """Hands out the given versions one per ``take``, then asks the run to stop (nothing is announced after)."""

    def __init__(self, versions: list[int], stop: threading.Event) -> None:
        self.pending = [(v, {"weight": torch.full((1, 1), float(v)), "bias": torch.zeros(1)}) for v in versions]
        self.stop = stop
        self.newest_version = self.latest_version = versions[-1]

    def take(self) -> tuple[int, dict] | None:
        if self.pending:
            return self.pending.pop(0)
        self.stop.set()
        return None

    def wait_for(self, version: int, timeout: float) -> bool:
        return False

    def close(self) -> None:
        pass


def scored_versions(
    versions: list[int], every: int, final: bool, monkeypatch: pytest.MonkeyPatch, base: float = 0.0, transfer="bf16"
) -> dict[int, float]:
    scores: dict[int, float] = {}
    ctx = SimpleNamespace(
        config=SimpleNamespace(
            eval=SimpleNamespace(every_versions=every, final=final),
            weights=SimpleNamespace(transfer_dtype=transfer),
        ),
        metric=lambda name, value, step, **labels: scores.__setitem__(step, value) if name == EVAL_ACCURACY else None,
        producer=SimpleNamespace(flush=lambda: None),
    )
    evaluator = Evaluator.__new__(Evaluator)  # everything but the model loading of __init__
    evaluator.ctx, evaluator.policy, evaluator.last_evaluated, evaluator.unscored = ctx, "main", -1, None
    evaluator.model = torch.nn.Linear(1, 1)
    with torch.no_grad():
        evaluator.model.weight.fill_(base)
    evaluator.score = lambda: evaluator.model.weight.item()  # "accuracy" = the version whose weights are loaded
    stop = threading.Event()
    follower = ScriptedFollower(versions, stop)
    monkeypatch.setattr(evaluator_module, "follow_weights", lambda ctx, policy, payload: follower)
    evaluator.run(stop)
    return scores


def test_the_version_a_run_ends_on_is_scored_even_when_not_due(monkeypatch: pytest.MonkeyPatch) -> None:
    scores = scored_versions([1, 2, 3, 4, 5, 6, 7], every=5, final=True, monkeypatch=monkeypatch)
    assert scores == {0: 0.0, 5: 5.0, 7: 7.0}  # version 7 scored from its own weights


def test_no_final_evaluation_when_the_last_version_was_scored_or_final_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert scored_versions([1, 2, 3, 4, 5], every=5, final=True, monkeypatch=monkeypatch) == {0: 0.0, 5: 5.0}
    assert scored_versions([1, 2, 3, 4, 5, 6, 7], every=5, final=False, monkeypatch=monkeypatch) == {0: 0.0, 5: 5.0}


def test_the_base_is_scored_as_the_weights_topic_would_carry_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # 1 + 2**-10 is not a bf16 number (8 bits of mantissa): rounded, it is 1.0, as every later version
    # reaches the evaluator through the weights topic; a gain over an unrounded base would be partly rounding
    base = 1.0 + 2.0**-10
    assert scored_versions([1], every=1, final=True, monkeypatch=monkeypatch, base=base)[0] == 1.0
    assert scored_versions([1], every=1, final=True, monkeypatch=monkeypatch, base=base, transfer="fp32")[0] == base


def system_scored_pairs(
    solver: list[int], verifier: list[int], every: int, final: bool, monkeypatch: pytest.MonkeyPatch
) -> list[dict[str, int]]:
    """The version pairs the system evaluator scores when the two weights topics carry these versions."""
    from astraflow.consumers.evaluators import system as system_module
    from astraflow.consumers.evaluators.system import SystemEvaluator

    scored: list[dict[str, int]] = []
    stop = threading.Event()
    followers = {"solver": ScriptedFollower(solver, stop), "verifier": ScriptedFollower(verifier, threading.Event())}
    ctx = SimpleNamespace(
        config=SimpleNamespace(eval=SimpleNamespace(every_versions=every, final=final)),
        producer=SimpleNamespace(flush=lambda: None),
    )
    evaluator = SystemEvaluator.__new__(SystemEvaluator)  # everything but the model loading of __init__
    evaluator.ctx, evaluator.scored = ctx, None
    evaluator.models = {"solver": torch.nn.Linear(1, 1), "verifier": torch.nn.Linear(1, 1)}
    evaluator.versions = {"solver": 0, "verifier": 0}

    def evaluate() -> None:  # records the pair and the weights it was scored with
        weights = {policy: int(model.weight.item()) for policy, model in evaluator.models.items()}
        assert weights == {policy: version for policy, version in evaluator.versions.items()} or not scored
        scored.append(dict(evaluator.versions))
        evaluator.scored = dict(evaluator.versions)

    evaluator.evaluate = evaluate
    monkeypatch.setattr(system_module, "follow_weights", lambda ctx, policy, payload: followers[policy])
    evaluator.run(stop)
    return scored


def test_the_system_evaluator_scores_the_pair_a_run_ends_with(monkeypatch: pytest.MonkeyPatch) -> None:
    pairs = system_scored_pairs([1, 2, 3, 4, 5, 6, 7], [1, 2, 3], every=5, final=True, monkeypatch=monkeypatch)
    assert pairs[0] == {"solver": 0, "verifier": 0} and pairs[-1] == {"solver": 7, "verifier": 3}
    assert len(pairs) == 3  # the base, the pair where the solver reached 5, and the last one
    off = system_scored_pairs([1, 2, 3, 4, 5, 6, 7], [1, 2, 3], every=5, final=False, monkeypatch=monkeypatch)
    assert off[-1] != {"solver": 7, "verifier": 3} and len(off) == 2
    done = system_scored_pairs([1, 2, 3, 4, 5], [1], every=5, final=True, monkeypatch=monkeypatch)
    assert done == [{"solver": 0, "verifier": 0}, {"solver": 5, "verifier": 1}]  # the last pair was scored: not again
