"""``astraflow warmup``: the base checkpoint a run starts from, built once and cached.

With ``model.path`` set, that checkpoint is the base and nothing is trained. Otherwise a tiny
model is built from the ``model`` section, supervised on the task's train split until held-out
greedy exact match reaches ``warmup.target_accuracy`` (to the step, once an evaluation lands more than
``warmup.max_overshoot`` past it: ``supervised_warmup``), and saved with
``save_pretrained``. The result is cached under ``$ASTRAFLOW_CACHE`` (default
``~/.cache/astraflow``) by a hash of the model, task and warm-up sections and the policy's role,
and copied into ``{run_dir}/base`` (``{run_dir}/base/{policy}`` with ``policies``) where every
component loads it. A multi-policy run warms each policy up on its own data (``load_policy_split``).

A multi-turn workflow (``search``, ``code``, ``rooms``, ``http_env``) gets a tokenizer over its
task's alphabet (``task_alphabet``), a longer context, and a warm-up on demonstrated episodes
played in the run's own environments, scored by the greedy held-out success rate of the same
episodes the evaluator plays (``sft.py``); its cache key adds the workflow, the reward, the
``agent`` section and the turn budget.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

from astraflow.config import RunConfig
from astraflow.core.rundir import RunDir, cache_root
from astraflow.episodes.loop import AgentLimits, demonstrate
from astraflow.runtime.base_checkpoint import base_checkpoint_dir
from astraflow.tasks.catalog import is_multi_turn, open_environments
from astraflow.tasks.datasets import load_policy_split, task_alphabet, task_data_version, task_demonstration

logger = logging.getLogger(__name__)


def _cache_key(config: RunConfig) -> str:
    sections = {name: getattr(config, name).model_dump(mode="json") for name in ("model", "task", "warmup")}
    if config.warmup.micro_batch_tokens is None:  # keys from before the option stay what they were
        del sections["warmup"]["micro_batch_tokens"]
    if config.role != "answer":  # keys of single-role runs stay what they were, so their caches stay valid
        sections["role"] = {
            "role": config.role,
            "max_new_tokens": config.rollout.max_new_tokens,
            "rows": "false claims",
        }
    if is_multi_turn(config.rollout.workflow):
        r = config.rollout
        sections["agent"] = {
            "workflow": r.workflow,
            "reward": r.reward,
            "max_new_tokens": r.max_new_tokens,
            **config.agent.model_dump(mode="json"),
        }
    if config.engine.type == "simulated":  # its base's context holds the simulated responses (``_train_base``)
        sections["simulated"] = {"max_new_tokens": config.rollout.max_new_tokens}
    version = task_data_version(config.task.kind)
    if version > 1:  # tasks whose generator never changed keep their keys, and their caches
        sections["data"] = {"version": version}
    return hashlib.sha256(json.dumps(sections, sort_keys=True).encode()).hexdigest()[:16]


AGENT_CONTEXT = 1024
"""Positions of a tiny model for multi-turn tasks (prompt and every turn); single-turn tasks keep 64."""


def _train_base(config: RunConfig, run_dir: Path, target: Path) -> None:
    import torch

    from astraflow.basemodel.tiny import TinyModelSpec, build_char_tokenizer, build_tiny_model
    from astraflow.engines.loading import save_policy

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    m, w = config.model, config.warmup
    multi_turn = is_multi_turn(config.rollout.workflow)
    tokenizer = build_char_tokenizer(task_alphabet(config.task.kind))
    spec = TinyModelSpec(
        hidden_size=m.hidden, num_layers=m.layers, num_heads=m.heads, intermediate_size=4 * m.hidden, seed=m.seed
    )
    positions = AGENT_CONTEXT if multi_turn else spec.max_positions
    if config.engine.type == "simulated":
        # a simulated engine's tokens stand for those of the model its time model describes, up to
        # rollout.max_new_tokens a response: the base's context holds them, as that model's would, so the stream
        # does not dead-letter them as too long (rotary positions: no weights change; nothing runs the tiny model
        # on them, a simulated trainer included)
        positions = max(positions, spec.max_positions + config.rollout.max_new_tokens)
    model = build_tiny_model(tokenizer, TinyModelSpec(**{**vars(spec), "max_positions": positions}))
    train = load_policy_split(config, run_dir, "train", targets=True)
    heldout = load_policy_split(config, run_dir, "heldout", targets=True)
    fit_options = {
        "max_steps": w.max_steps,
        "batch_size": w.batch_size,
        "lr": w.lr,
        "eval_every": w.eval_every,
        "max_overshoot": w.max_overshoot,
        "micro_batch_tokens": w.micro_batch_tokens,
        "seed": m.seed,
    }
    if multi_turn:
        result = _warm_up_on_demonstrations(config, run_dir, model, tokenizer, train, heldout, fit_options)
    else:
        from astraflow.basemodel.sft import supervised_warmup

        # the tiny model's context bounds what its evaluation may write
        # (a simulated cluster's 4096-token budget is another model's)
        answer_tokens = min(config.rollout.max_new_tokens, spec.max_positions)
        result = supervised_warmup(
            model, tokenizer, train, heldout, target_em=w.target_accuracy, max_new_tokens=answer_tokens, **fit_options
        )
    logger.info("warm-up: held-out score %.3f after %d steps (%.1f s)", result.heldout_em, result.steps, result.seconds)
    save_policy(model, tokenizer, target)
    (target / "warmup.json").write_text(
        json.dumps(
            {"steps": result.steps, "heldout_em": result.heldout_em, "seconds": result.seconds, "curve": result.curve}
        )
    )


def _warm_up_on_demonstrations(
    config: RunConfig, run_dir: Path, model, tokenizer, train: list, heldout: list, fit_options: dict
):
    from astraflow.basemodel.sft import demonstration_examples, fit
    from astraflow.episodes.heldout import evaluate_episodes, evaluation_task

    r = config.rollout
    make_env = open_environments(r.workflow, r.reward, config.agent, RunDir(run_dir).data)
    limits = AgentLimits.from_config(config.agent, r.max_new_tokens)
    turns = task_demonstration(config.task.kind)
    transcripts = [
        demonstrate(make_env(evaluation_task(row, r.workflow), 0), turns(row), tokenizer, limits, row.prompt_id)
        for row in train
    ]
    return fit(
        model,
        tokenizer.pad_token_id,
        demonstration_examples(transcripts),
        lambda: evaluate_episodes(model, tokenizer, heldout, make_env, limits, workflow=r.workflow),
        target=config.warmup.target_accuracy,
        **fit_options,
    )


def ensure_base_checkpoint(config: RunConfig, run_dir: Path) -> Path:
    """The run's base checkpoint directory, warming a tiny model up first when needed."""
    target = base_checkpoint_dir(config, run_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    if config.model.path or (target / "config.json").is_file():
        return target
    cached = cache_root() / "base" / _cache_key(config)
    if not (cached / "config.json").is_file():
        building = cached.with_name(cached.name + f".tmp{os.getpid()}")
        shutil.rmtree(building, ignore_errors=True)
        _train_base(config, run_dir, building)
        shutil.rmtree(cached, ignore_errors=True)
        os.replace(building, cached)
    else:
        logger.info("reusing the cached base checkpoint %s", cached)
    shutil.copytree(cached, target)
    return target
