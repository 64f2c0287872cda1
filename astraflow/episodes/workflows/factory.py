"""The workflow a run config names: ``rollout.workflow``, and the policies it involves."""

from __future__ import annotations

from pathlib import Path

from astraflow.config import AgentConfig, RunConfig
from astraflow.episodes.workflows.base import Workflow
from astraflow.episodes.workflows.collab import build_collab_workflow
from astraflow.episodes.workflows.multiturn import build_multi_turn_workflow
from astraflow.episodes.workflows.single_turn import IndependentPolicies, SingleTurnWorkflow, reward_function


def build_workflow(
    kind: str,
    policy: str,
    reward: str,
    max_new_tokens: int,
    temperature: float,
    agent: AgentConfig | None = None,
    data_dir: Path | None = None,
) -> Workflow:
    """The workflow named by ``rollout.workflow``; the multi-turn ones (``multiturn.py``) also
    read the ``agent`` section and the run's data directory (where the task wrote its corpus)."""
    if kind == "single_turn":
        return SingleTurnWorkflow(policy, reward_function(reward), max_new_tokens, temperature)
    return build_multi_turn_workflow(
        kind, policy, reward, max_new_tokens, temperature, agent or AgentConfig(), data_dir
    )


def build_run_workflow(config: RunConfig, data_dir: Path | None = None) -> Workflow:
    """The workflow of a run config: a multi-policy one (``collab.py``) gets the policies'
    narrowed configs; with several policies, any other workflow is played by each policy on its
    own (``IndependentPolicies``); else the single ``policy``'s."""
    cfg = config.for_policy(config.policy_names()[0]) if config.policies else config
    r = cfg.rollout
    if r.workflow == "solver_verifier":
        return build_collab_workflow(r.workflow, [config.for_policy(name) for name in config.policy_names()])
    if len(config.policy_names()) > 1:
        narrowed = {name: config.for_policy(name) for name in config.policy_names()}
        return IndependentPolicies(
            {
                name: build_workflow(
                    c.rollout.workflow,
                    name,
                    c.rollout.reward,
                    c.rollout.max_new_tokens,
                    c.rollout.temperature,
                    c.agent,
                    data_dir,
                )
                for name, c in narrowed.items()
            },
            {name: c.rollout.group_size for name, c in narrowed.items()},
        )
    return build_workflow(r.workflow, cfg.policy, r.reward, r.max_new_tokens, r.temperature, cfg.agent, data_dir)
