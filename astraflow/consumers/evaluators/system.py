"""System evaluator: an answering policy checked by a judging policy, per version pair.

It follows the weights topics of the run's ``role: answer`` and ``role: judge`` policies (no
group, like the per-policy evaluator) and scores each new version pair with
``astraflow.episodes.judged`` on the held-out split: ``eval.system.alone``,
``eval.system.judged``, ``eval.system.majority`` (a vote over the same candidates, no judge),
``eval.system.pass_at_k`` and ``eval.system.judge_accuracy``, labelled
with ``versions`` (``name=version,name=version``). The base pair is scored first, rounded to each
policy's ``weights.transfer_dtype`` as the evaluator rounds its base (``policy.py``). A pair is
scored again once either policy moved ``eval.every_versions`` past the last scored pair; versions
in between are skipped, never queued. With ``eval.final`` (the default) the pair a run ends with is
scored when the evaluator stops, if it was not already.
"""

from __future__ import annotations

import logging
import threading
import time

from astraflow.consumers.evaluators.policy import FINAL_WAIT_S, settle
from astraflow.core.crashpoints import crash_point
from astraflow.core.errors import ConfigError
from astraflow.core.metric_names import eval_system
from astraflow.runtime.base_checkpoint import base_checkpoint_path
from astraflow.runtime.context import ComponentContext
from astraflow.tasks.datasets import load_task_split
from astraflow.weights.follow import follow_weights
from astraflow.weights.payload import to_transfer

logger = logging.getLogger(__name__)


class SystemEvaluator:
    """Scores the answer policy alone and checked by the judge policy."""

    def __init__(self, ctx: ComponentContext) -> None:
        import torch

        from astraflow.engines.loading import load_policy

        cfg = ctx.config
        torch.set_num_threads(cfg.eval.threads)
        roles = {cfg.for_policy(name).role: cfg.for_policy(name) for name in cfg.policy_names()}
        if set(roles) != {"answer", "judge"}:
            raise ConfigError(
                "policies: the system evaluator needs a policy with role 'answer' and one with role 'judge'"
            )
        self.ctx = ctx
        self.answer, self.judge = roles["answer"], roles["judge"]
        self.models = {
            c.policy: load_policy(base_checkpoint_path(c, ctx.run_dir))[0] for c in (self.answer, self.judge)
        }
        for c in (self.answer, self.judge):  # the base pair as the weights topics would carry it, like every later pair
            model = self.models[c.policy]
            model.load_state_dict(to_transfer(model.state_dict(), c.weights.transfer_dtype))
        self.tokenizer = load_policy(base_checkpoint_path(self.answer, ctx.run_dir))[1]
        self.heldout = load_task_split(cfg.task, ctx.run_dir, "heldout")
        self.versions = {policy: 0 for policy in self.models}
        self.scored: dict[str, int] | None = None

    def evaluate(self) -> None:
        from astraflow.episodes.judged import evaluate_system

        a, j = self.answer, self.judge
        result = evaluate_system(
            self.models[a.policy],
            self.models[j.policy],
            self.tokenizer,
            self.heldout,
            k=a.rollout.system_samples,
            answer_tokens=a.rollout.max_new_tokens,
            judge_tokens=j.rollout.max_new_tokens,
            temperature=a.rollout.temperature,
            seed=a.task.seed,
        )
        self.scored = dict(self.versions)
        label = ",".join(f"{policy}={version}" for policy, version in self.versions.items())
        for name, value in vars(result).items():
            self.ctx.metric(eval_system(name), value, self.versions[a.policy], versions=label)
        crash_point("system_evaluator.flush_figures", label)
        self.ctx.producer.flush()
        logger.info(
            "versions %s: alone %.3f, judged %.3f, majority %.3f (pass@k %.3f, judge %.3f)",
            label,
            result.alone,
            result.judged,
            result.majority,
            result.pass_at_k,
            result.judge_accuracy,
        )

    def due(self) -> bool:
        every = self.ctx.config.eval.every_versions
        return self.scored is None or any(self.versions[p] - self.scored[p] >= every for p in self.versions)

    def run(self, stop: threading.Event) -> None:
        self.evaluate()
        followers = {policy: follow_weights(self.ctx, policy, payload=True) for policy in self.models}
        try:
            while not stop.is_set():
                moved = False
                for policy, follower in followers.items():
                    pending = follower.take()
                    if pending is not None:
                        self.versions[policy], state = pending
                        self.models[policy].load_state_dict(state)
                        moved = True
                if moved and self.due():
                    self._evaluate_or_dead_letter()
                elif not moved:
                    first = next(iter(followers))
                    followers[first].wait_for(self.versions[first] + 1, timeout=0.5)
            if self.ctx.config.eval.final:
                self._final(followers)
        finally:
            for follower in followers.values():
                follower.close()

    def _evaluate_or_dead_letter(self) -> None:
        try:
            self.evaluate()
        except Exception as exc:  # one set of versions that cannot be scored never stops the evaluator
            logger.exception("system evaluation of versions %s failed", self.versions)
            reason = f"system evaluation of versions {self.versions} failed: {type(exc).__name__}: {exc}"
            self.ctx.dead_letter(None, reason, exc)
            crash_point("system_evaluator.flush_dead_letter")
            self.ctx.producer.flush()

    def _final(self, followers: dict) -> None:
        """On a stop, score the pair the run ends with if it was not, as the per-policy evaluator
        does with its newest version (``evaluator.Evaluator._final``): the launcher stops the
        trainers first, so each follower takes in what is left on its weights topic (until nothing
        new came for ``SETTLE_S`` and every announced version is in, at most ``FINAL_WAIT_S`` in
        all), and the newest version of each policy is loaded before the last evaluation."""
        deadline = time.monotonic() + FINAL_WAIT_S
        for policy, follower in followers.items():
            settle(follower, deadline)
            pending = follower.take()
            if pending is not None:
                self.versions[policy], state = pending
                self.models[policy].load_state_dict(state)
        if self.scored != self.versions:
            logger.info("stopping: a final system evaluation of versions %s", self.versions)
            self._evaluate_or_dead_letter()
