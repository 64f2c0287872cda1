"""Evaluator consumer: held-out greedy exact match of each new weight version → metrics topic.

A ``role: judge`` policy is scored by its verdicts instead (``judge_reward`` on judging rows). A
multi-turn workflow (``search``, ``code``, ``rooms``, ``http_env``) is scored by the mean reward
of one greedy episode per held-out row, played in the run's own environments by the loop the
rollout producers use (``models.evaluation.evaluate_episodes``): for 0/1 rewards, the success rate.

It follows the weights topic like a rollout producer does (its own follower, no group), so it can
attach to a run at any time. When training outruns evaluation, the newest version wins: versions
in between are skipped, never queued, and ``eval.every_versions`` thins the evaluations further.
The base checkpoint is evaluated as version 0 at start, whatever the topic holds: it is the
baseline of the run's ``summary.json``. It is scored rounded to ``weights.transfer_dtype``, as every
later version comes off the weights topic, so a gain over it is training's and not rounding's: in
bf16 the code example's base scored 0.181 unrounded and 0.178 rounded, and a run at learning rate 0
showed a "gain" of -0.003.
"""

from __future__ import annotations

import logging
import threading
import time

from astraflow.core.crashpoints import crash_point
from astraflow.core.metric_names import EVAL_ACCURACY, EVAL_SECONDS
from astraflow.runtime.base_checkpoint import base_checkpoint_path
from astraflow.runtime.context import ComponentContext
from astraflow.tasks.datasets import load_policy_split
from astraflow.weights.follow import follow_weights
from astraflow.weights.payload import to_transfer

logger = logging.getLogger(__name__)

SETTLE_S = 2.0
"""On a stop, how long no new version may arrive before the follower counts as caught up."""
FINAL_WAIT_S = 30.0
"""On a stop, the longest wait for the follower to take in the versions still on the topic."""


def settle(follower, deadline: float) -> None:
    """On a stop, let ``follower`` take in what is left on its weights topic: until nothing new came
    for ``SETTLE_S`` and every announced version is in, or until ``deadline`` (``time.monotonic``)."""
    while time.monotonic() < deadline:
        seen = follower.newest_version
        follower.wait_for(seen + 1, timeout=SETTLE_S)
        if follower.newest_version == seen and follower.latest_version >= seen:
            return


class Evaluator:
    """Scores weight versions of one policy on the held-out split."""

    def __init__(self, ctx: ComponentContext, policy: str) -> None:
        import torch

        from astraflow.engines.loading import load_policy

        torch.set_num_threads(ctx.config.eval.threads)
        self.ctx = ctx
        self.policy = policy
        self.model, self.tokenizer = load_policy(base_checkpoint_path(ctx.config, ctx.run_dir))
        self.heldout = load_policy_split(ctx.config, ctx.run_dir, "heldout")
        self.last_evaluated = -1
        self.unscored: tuple[int, dict] | None = None  # the newest version taken in but not due
        self.score = self._scorer()

    def _scorer(self):
        """What one evaluation computes: ``score()`` → held-out accuracy (or success rate) of ``self.model``
        (``episodes.heldout``, the episode code the producers run)."""
        from astraflow.episodes.heldout import heldout_scorer

        return heldout_scorer(self.ctx.config, self.ctx.run_dir, self.model, self.tokenizer, self.heldout)

    def due(self, version: int) -> bool:
        every = self.ctx.config.eval.every_versions
        return version - self.last_evaluated >= every

    def evaluate(self, version: int, state: dict) -> float:
        started = time.perf_counter()
        self.model.load_state_dict(state)
        accuracy = self.score()
        self.last_evaluated = version
        self.ctx.metric(EVAL_ACCURACY, accuracy, version, policy=self.policy)
        self.ctx.metric(EVAL_SECONDS, time.perf_counter() - started, version, policy=self.policy)
        crash_point("evaluator.flush_accuracy", version)
        self.ctx.producer.flush()
        logger.info("version %d: held-out accuracy %.3f", version, accuracy)
        return accuracy

    def run(self, stop: threading.Event) -> None:
        self.evaluate(0, to_transfer(self.model.state_dict(), self.ctx.config.weights.transfer_dtype))
        follower = follow_weights(self.ctx, self.policy, payload=True)
        try:
            while not stop.is_set():
                pending = follower.take()
                if pending is None:
                    follower.wait_for(max(follower.latest_version, self.last_evaluated) + 1, timeout=0.5)
                    continue
                version, state = pending
                if self.due(version):
                    self.unscored = None  # an older skipped version's weights are no longer the final ones
                    self._evaluate_or_dead_letter(version, state)
                else:
                    self.unscored = pending
            if self.ctx.config.eval.final:
                self._final(follower)
        finally:
            follower.close()

    def _evaluate_or_dead_letter(self, version: int, state: dict) -> None:
        try:
            self.evaluate(version, state)
        except Exception as exc:  # one version that cannot be scored never stops the evaluator
            logger.exception("evaluating version %d failed", version)
            self.last_evaluated = version
            self.ctx.dead_letter(None, f"evaluation of version {version} failed: {type(exc).__name__}: {exc}", exc)
            crash_point("evaluator.flush_dead_letter", version)
            self.ctx.producer.flush()

    def _final(self, follower) -> None:
        """On a stop, score the newest version if it was not: the launcher stops the trainers first,
        so the follower takes in what is left on the weights topic (until nothing new came for
        ``SETTLE_S`` and every announced version is in, at most ``FINAL_WAIT_S``) and the run's last
        evaluation is of the weights it ends with: the newest version on the topic, or else the newest
        one taken in before the stop and skipped as not due."""
        settle(follower, time.monotonic() + FINAL_WAIT_S)
        pending = follower.take() or self.unscored
        if pending is not None and pending[0] > self.last_evaluated:
            logger.info("stopping: a final evaluation of version %d", pending[0])
            self._evaluate_or_dead_letter(*pending)
