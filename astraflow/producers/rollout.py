"""Rollout producer (Rollout-as-a-Service): tasks in, trajectories out, weights refreshed.

Steps of one iteration (what makes it lose nothing):

1. Take the newest complete weight version the background ``WeightFollower`` assembled, if any,
   and load it into the engine *between* generations: every token of one generation carries the
   same version, recorded per token in the trajectory.
2. Poll up to ``prompts_per_generation`` tasks from ``{run}.tasks.{workflow}`` as a member of the
   producers' consumer group (joining or leaving rebalances the partitions: elastic rollout).
3. Generate ``group_size`` samples per task in one batch, score them with the workflow's reward
   (a reward that raises dead-letters the task's trajectories, never a silent zero), and send
   Trajectory records keyed by group id. Trajectory ids are ``{task_id}/{sample}``: deterministic,
   so a task redone after a crash yields the same ids and the stream drops the duplicates.
4. Flush (every trajectory acknowledged), and only then commit the task offsets.
"""

from __future__ import annotations

import logging
import platform
import threading
import time

import numpy as np

from astraflow.context import ComponentContext, now_ms
from astraflow.errors import AstraFlowError, LogError, RewardError
from astraflow.schemas.records import RolloutTask, Trajectory, Turn
from astraflow.weights.follow import WeightFollower

logger = logging.getLogger(__name__)
CATCH_UP_SECONDS = 60.0


class RolloutProducer:
    """Samples groups for tasks with a torch engine and writes them to the trajectories topic."""

    def __init__(self, ctx: ComponentContext, region: str = "local") -> None:
        import torch

        from astraflow.models.base import base_checkpoint_path
        from astraflow.models.loading import load_policy
        from astraflow.producers.engine import TorchEngine
        from astraflow.tasks.arithmetic import exact_match_reward

        cfg = ctx.config
        torch.set_num_threads(cfg.rollout.threads)
        self.ctx = ctx
        self.region = region
        self.hardware = f"cpu:{platform.processor() or platform.machine()}x{cfg.rollout.threads}"
        model, tokenizer = load_policy(base_checkpoint_path(cfg, ctx.run_dir))
        self.engine = TorchEngine(model, tokenizer, version=0)
        self.reward = exact_match_reward
        self.generated = 0

    def _refresh(self, follower: WeightFollower) -> None:
        pending = follower.take()
        if pending is None:
            return
        version, state = pending
        self.engine.load_state_dict(state, version)
        lag_ms = now_ms() - follower.latest_published_ms
        self.ctx.metric("rollout.weights_applied_ms", lag_ms, version)
        logger.info("applied weight version %d", version)

    def run(self, stop: threading.Event) -> None:
        ctx = self.ctx
        cfg = ctx.config
        follower = WeightFollower(ctx.log, ctx.topics.weights(cfg.policy), payload=True).start()
        if not follower.wait_for(0, timeout=CATCH_UP_SECONDS):
            logger.warning("no weight version published yet; sampling with the base checkpoint as version 0")
        follower.wait_caught_up(timeout=CATCH_UP_SECONDS)
        consumer = ctx.log.consumer(group_id=f"{cfg.run}.rollout.{cfg.workflow}")
        consumer.subscribe([ctx.topics.tasks()])
        try:
            while not stop.is_set():
                self._refresh(follower)
                messages = consumer.poll(max_records=cfg.rollout.prompts_per_generation, timeout=0.5)
                if not messages:
                    continue
                tasks = []
                for message in messages:
                    try:
                        tasks.append(ctx.codec.decode(message.value, expect=RolloutTask))
                    except AstraFlowError as exc:
                        ctx.dead_letter(message, f"undecodable task: {exc}", exc)
                self._produce(tasks, follower)
                ctx.producer.flush()
                try:
                    consumer.commit()
                except LogError as exc:
                    logger.warning("task commit rejected after a rebalance; the new owner redoes them: %s", exc)
        finally:
            follower.close()
            consumer.close()

    def _produce(self, tasks: list[RolloutTask], follower: WeightFollower) -> None:
        ctx = self.ctx
        cfg = ctx.config.rollout
        if not tasks:
            return
        started = time.perf_counter()
        groups = self.engine.generate([t.prompt for t in tasks], n=tasks[0].group_size, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature)
        generate_ms = (time.perf_counter() - started) * 1000 / len(tasks)
        version = self.engine.version
        rewards = []
        for task, generations in zip(tasks, groups):
            trajectories = []
            try:
                for index, gen in enumerate(generations):
                    t0 = time.perf_counter()
                    reward = self.reward(gen.text, task.reference)
                    trajectories.append(self._trajectory(task, index, gen, reward, version, generate_ms, (time.perf_counter() - t0) * 1000))
            except RewardError as exc:
                ctx.dead_letter(None, f"reward failed for task {task.task_id}: {exc}", exc)
                continue
            for trajectory in trajectories:
                rewards.append(trajectory.reward)
                ctx.producer.send(ctx.topics.trajectories(ctx.config.policy), ctx.codec.encode(trajectory), key=task.group_id.encode())
        self.generated += len(rewards)
        elapsed = time.perf_counter() - started
        ctx.metric("rollout.samples_per_s", len(rewards) / max(elapsed, 1e-6), version, region=self.region)
        ctx.metric("rollout.version_lag", max(follower.latest_version, 0) - version, version, region=self.region)
        if rewards:
            ctx.metric("rollout.mean_reward", float(np.mean(rewards)), version, region=self.region)

    def _trajectory(self, task: RolloutTask, index: int, gen, reward: float, version: int, generate_ms: float, reward_ms: float) -> Trajectory:
        n = len(gen.response_ids)
        trajectory_id = f"{task.task_id}/{index}"
        return Trajectory(
            trajectory_id=trajectory_id,
            episode_id=trajectory_id,
            group_id=task.group_id,
            task_id=task.task_id,
            prompt_id=task.prompt_id,
            policy=self.ctx.config.policy,
            workflow=task.workflow,
            prompt_ids=gen.prompt_ids,
            response_ids=gen.response_ids,
            behaviour_logprobs=gen.logprobs,
            token_versions=np.full(n, version, dtype=np.int32),
            loss_mask=np.ones(n, dtype=np.uint8),
            reward=float(reward),
            reward_components={"exact_match": float(reward)},
            turns=[Turn("policy", 0, n, version)],
            response_text=gen.text,
            finish_reason=gen.finish_reason,
            group_size=task.group_size,
            producer_id=self.ctx.instance,
            region=self.region,
            hardware=self.hardware,
            generate_ms=generate_ms,
            reward_ms=reward_ms,
            created_ms=now_ms(),
        )
