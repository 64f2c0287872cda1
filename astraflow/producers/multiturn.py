"""Multi-turn workflows: policy turns alternate with environment / tool turns, token-exact.

A ``MultiTurnWorkflow`` runs ``group_size`` episodes per task, each against its own ``EpisodeEnv``
(``astraflow.envs``). One round of the loop is:

1. **Policy turn**, batched over every live episode: the engine continues each episode's token
   ids (prompt + every earlier turn, exactly as stored) until the end-of-turn token (eos) or the
   turn's budget. The sampled ids, their behaviour log-probs and the engine's weight version
   are appended as they came out of the sampler, loss mask 1.
2. **Environment turn**, episodes in parallel on a small thread pool: the turn's ids are decoded
   only so the environment can read them; its answer is tokenised *on its own* and appended with
   loss mask 0, log-prob 0 and the version of the turn it answers. The transcript is never
   decoded and re-tokenised as a whole, the bug class of TRL #5224: what the trainer scores is
   exactly what the sampler produced and conditioned on.
3. **Limits**: an episode ends when the environment says ``done`` (``stop``), when a turn hits
   its token budget without eos (``length``), after ``max_turns`` policy turns (``turn_limit``),
   when the response would exceed ``max_total_tokens`` (``token_limit``), or when its tool time
   exceeds ``max_tool_seconds`` (``tool_time_limit``). Then the environment scores it.

Any ``AstraFlowError`` from an environment (server down, sandbox broken) fails the whole task:
its group would be incomplete, and a broken environment must not look like a zero reward.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from astraflow.envs.base import EnvError, EnvFactory, EpisodeEnv
from astraflow.errors import AstraFlowError, RewardError
from astraflow.producers.token_engine import TokenEngine, as_token_engine
from astraflow.producers.workflows import Provenance, TaskOutcome, Workflow
from astraflow.schemas.records import RolloutTask, Trajectory, Turn

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentLimits:
    """Bounds of one episode (``agent`` section of the config, plus ``rollout.max_new_tokens``)."""

    max_turns: int = 4  # policy turns
    max_new_tokens: int = 32  # tokens of one policy turn
    max_total_tokens: int = 256  # response tokens of the episode, policy and environment together
    max_observation_tokens: int = 64  # an environment turn longer than this is cut
    max_tool_seconds: float = 30.0  # environment time of the episode
    tool_workers: int = 4  # environment steps run in parallel


@dataclass
class Episode:
    """One episode's transcript, built span by span; ``response`` arrays are [R] once joined."""

    task_pos: int
    index: int
    env: EpisodeEnv
    prompt_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    spans: list[tuple[np.ndarray, np.ndarray, int, int]] = field(default_factory=list)  # ids, logprobs, version, mask
    turns: list[Turn] = field(default_factory=list)
    policy_turns: int = 0
    tool_seconds: float = 0.0
    generate_ms: float = 0.0
    finish_reason: str | None = None

    @property
    def length(self) -> int:
        return self.turns[-1].end if self.turns else 0

    def context(self) -> np.ndarray:
        """[P + R] int32: what the policy conditions on for its next turn."""
        return np.concatenate([self.prompt_ids, *(span[0] for span in self.spans)]).astype(np.int32)

    def append(self, ids: np.ndarray, logprobs: np.ndarray, version: int, role: str) -> None:
        if len(ids):
            mask = int(role == "policy")
            self.spans.append((np.asarray(ids, dtype=np.int32), np.asarray(logprobs, dtype=np.float32), version, mask))
            self.turns.append(Turn(role, self.length, self.length + len(ids), version))

    def last_policy_ids(self) -> np.ndarray:
        return next(span[0] for span in reversed(self.spans) if span[3])


class MultiTurnWorkflow(Workflow):
    """One policy against one environment per episode (see the module docstring for the loop)."""

    def __init__(self, policy: str, make_env: EnvFactory, limits: AgentLimits, temperature: float, greedy: bool = False) -> None:
        self.policies = (policy,)
        self.policy = policy
        self.make_env = make_env
        self.limits = limits
        self.temperature = temperature
        self.greedy = greedy
        self._engines: dict[int, TokenEngine] = {}

    def run_batch(self, engines: Mapping[str, object], tasks: list[RolloutTask], provenance: Provenance) -> list[TaskOutcome]:
        raw = engines[self.policy]
        engine = self._engines.setdefault(id(raw), as_token_engine(raw))
        failed: dict[int, AstraFlowError] = {}
        episodes: list[Episode] = []
        try:
            for pos, task in enumerate(tasks):
                try:
                    for index in range(task.group_size):
                        episodes.append(Episode(pos, index, self.make_env(task, index)))
                        episodes[-1].prompt_ids = self._encode(engine, episodes[-1].env.reset(), task)
                except AstraFlowError as exc:
                    failed[pos] = exc
            with ThreadPoolExecutor(self.limits.tool_workers, thread_name_prefix="env") as pool:
                live = [e for e in episodes if e.task_pos not in failed]
                while live:
                    self._policy_turn(engine, live)
                    self._environment_turn(engine, pool, [e for e in live if e.finish_reason is None], failed)
                    live = [e for e in live if e.finish_reason is None and e.task_pos not in failed]
            outcomes = [TaskOutcome(task) for task in tasks]
            for episode in episodes:
                if episode.task_pos not in failed:
                    try:
                        outcomes[episode.task_pos].trajectories.append(self._trajectory(engine, tasks[episode.task_pos], episode, provenance))
                    except AstraFlowError as exc:
                        failed[episode.task_pos] = exc
        finally:
            for episode in episodes:
                self._close(episode)
        for pos, error in failed.items():
            outcomes[pos].trajectories, outcomes[pos].error = [], error
        return outcomes

    @staticmethod
    def _encode(engine: TokenEngine, prompt: str, task: RolloutTask) -> np.ndarray:
        ids = np.asarray(engine.tokenizer(prompt, add_special_tokens=False)["input_ids"], dtype=np.int32)
        if not len(ids):
            raise EnvError(f"the environment gave task {task.task_id} an empty prompt")
        return ids

    def _policy_turn(self, engine: TokenEngine, live: list[Episode]) -> None:
        limits = self.limits
        budgets = [min(limits.max_new_tokens, limits.max_total_tokens - e.length) for e in live]
        version = engine.version
        started = time.perf_counter()
        samples = engine.generate_ids([e.context() for e in live], max(budgets), self.temperature, self.greedy)
        share_ms = (time.perf_counter() - started) * 1000 / len(live)
        for episode, sample, budget in zip(live, samples, budgets, strict=True):
            ids, logprobs = sample.ids[:budget], sample.logprobs[:budget]
            episode.append(ids, logprobs, version, "policy")
            episode.policy_turns += 1
            episode.generate_ms += share_ms
            if not (sample.stopped and len(sample.ids) <= budget):
                episode.finish_reason = "token_limit" if episode.length >= limits.max_total_tokens else "length"

    def _environment_turn(self, engine: TokenEngine, pool: ThreadPoolExecutor, acting: list[Episode], failed: dict[int, AstraFlowError]) -> None:
        limits = self.limits
        actions = [engine.tokenizer.decode(e.last_policy_ids(), skip_special_tokens=True) for e in acting]
        futures = [pool.submit(self._step, e, action) for e, action in zip(acting, actions)]
        for episode, future in zip(acting, futures):
            try:
                result = future.result()
            except AstraFlowError as exc:
                failed.setdefault(episode.task_pos, exc)
                continue
            if result.done:
                episode.finish_reason = "stop"
            elif episode.policy_turns >= limits.max_turns:
                episode.finish_reason = "turn_limit"
            elif episode.tool_seconds > limits.max_tool_seconds:
                episode.finish_reason = "tool_time_limit"
            else:
                ids = engine.tokenizer(result.observation, add_special_tokens=False)["input_ids"][: limits.max_observation_tokens]
                if episode.length + len(ids) >= limits.max_total_tokens:
                    episode.finish_reason = "token_limit"
                else:
                    episode.append(np.asarray(ids, dtype=np.int32), np.zeros(len(ids), dtype=np.float32), episode.turns[-1].version, episode.env.role)

    @staticmethod
    def _step(episode: Episode, action: str):
        started = time.perf_counter()
        try:
            return episode.env.step(action)
        finally:
            episode.tool_seconds += time.perf_counter() - started

    def _trajectory(self, engine: TokenEngine, task: RolloutTask, episode: Episode, provenance: Provenance) -> Trajectory:
        started = time.perf_counter()
        components = {name: float(value) for name, value in episode.env.reward().items()}
        reward = components.get("reward", math.nan)
        if not math.isfinite(reward):
            raise RewardError(f"the environment of task {task.task_id} gave no finite 'reward' (got {components})")
        reward_ms = (time.perf_counter() - started) * 1000 + episode.tool_seconds * 1000
        ids, logprobs, versions, masks = zip(*((s[0], s[1], np.full(len(s[0]), s[2], np.int32), np.full(len(s[0]), s[3], np.uint8)) for s in episode.spans))
        response_ids = np.concatenate(ids).astype(np.int32)
        trajectory_id = f"{task.task_id}/{episode.index}"
        return Trajectory(
            trajectory_id=trajectory_id,
            episode_id=trajectory_id,
            group_id=task.group_id,
            task_id=task.task_id,
            prompt_id=task.prompt_id,
            policy=self.policy,
            workflow=task.workflow,
            prompt_ids=episode.prompt_ids,
            response_ids=response_ids,
            behaviour_logprobs=np.concatenate(logprobs).astype(np.float32),
            token_versions=np.concatenate(versions),
            loss_mask=np.concatenate(masks),
            reward=reward,
            reward_components=components,
            turns=list(episode.turns),
            response_text=engine.tokenizer.decode(response_ids, skip_special_tokens=False),
            finish_reason=episode.finish_reason or "stop",
            group_size=task.group_size,
            producer_id=provenance.producer_id,
            region=provenance.region,
            hardware=provenance.hardware,
            generate_ms=episode.generate_ms,
            reward_ms=reward_ms,
            created_ms=int(time.time() * 1000),
        )

    @staticmethod
    def _close(episode: Episode) -> None:
        try:
            episode.env.close()
        except AstraFlowError as exc:
            logger.warning("closing the environment of episode %d failed: %s", episode.index, exc)
