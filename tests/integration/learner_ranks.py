"""One rank of a learner trained on fixed batches, for the tests of a trainer of several ranks.

``python -m torch.distributed.run --nproc-per-node N -m tests.integration.learner_ranks BACKEND OUT [options]``
builds the tiny model of ``SPEC`` and the batches of ``BATCH_SIZES`` (the same in every process),
takes one optimizer step per batch with ``train.backend`` BACKEND (``torch``: DDP; ``fsdp``: FSDP2;
``deepspeed1``..``deepspeed3``: DeepSpeed at that ZeRO stage), each rank on its share, then writes
from rank 0 to ``OUT`` (``torch.save``) the full weights as the trainer's publisher copies them
(``to_transfer`` of ``backend.full_state``, read by every rank), each step's loss and gradient norm,
and for ``fsdp`` the full optimizer state of a checkpoint.

``--kl`` trains with the KL term of ``KL`` (``train.kl``: a reference re-synced half-way every two
versions, an adaptive coefficient), held by every rank as the backend holds the policy; each step's
figures then add the step's mean KL and its coefficient.

Options, for the tests of resuming under another world size:

- ``--save-after K DIR``: after the K-th step, every rank writes its part of a checkpoint into DIR
  with ``backend.save_shards`` (what the trainer's checkpoints do), and rank 0 its ``state.json``;
- ``--resume DIR``: before the first step, load that checkpoint (``backend.load_shards``) and train
  only the batches after the ones it holds.
"""

from __future__ import annotations

import faulthandler
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from astraflow.basemodel.tiny import TinyModelSpec, build_char_tokenizer, build_tiny_model
from astraflow.config.train import AdaptiveKlOptions, DeepSpeedOptions, KlConfig
from astraflow.infra.launch.ranks import run_then_exit
from astraflow.training.checkpoint import TrainerState
from astraflow.training.distributed import Ranks, init_group
from astraflow.training.learner import build_learner
from astraflow.training.step import PolicyExample, PolicyStepConfig
from astraflow.weights.payload import to_transfer

SPEC = TinyModelSpec(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=3)
STEP = PolicyStepConfig(lr=1e-3, lr_warmup_steps=0, lr_decay_steps=0, max_grad_norm=0.5, micro_batch_size=2)
KL = KlConfig(
    coef=1.0, reference="sync", sync_every=2, sync_mixup=0.5, adaptive=AdaptiveKlOptions(target=1e-4, horizon=50)
)
"""Every part of the KL term at once: the reference's forward, a sync of sharded weights, β moving each step."""
BATCH_SIZES = (7, 5, 8, 1, 6)
"""Five batches: odd sizes give ranks shares of different lengths, 1 leaves a rank with none."""
HANG_S = 270
"""A rank still running after this long prints every thread's stack to stderr and exits (status 1): a
run takes 15-30 s on 2 loaded cores and its test waits 300 s, so a hang fails with where it hung
instead of a bare timeout (a rank that hung in the process's exit, past this watchdog, is why ranks
end by ``run_then_exit``)."""


def batches(vocab_size: int) -> list[list[PolicyExample]]:
    """The fixed batches: random prompts and responses of varied lengths, some tokens masked."""
    rng = np.random.default_rng(0)
    out = []
    for size in BATCH_SIZES:
        batch = []
        for _ in range(size):
            prompt = rng.integers(3, vocab_size, size=int(rng.integers(3, 8)), dtype=np.int32)
            response = rng.integers(3, vocab_size, size=int(rng.integers(2, 7)), dtype=np.int32)
            mask = (rng.random(len(response)) > 0.2).astype(np.uint8)
            behaviour = (-rng.random(len(response)) * 3 - 0.5).astype(np.float32)
            batch.append(PolicyExample(prompt, response, behaviour, mask, float(rng.normal())))
        out.append(batch)
    return out


def train(
    backend: str,
    ranks: Ranks,
    save_after: tuple[int, Path] | None = None,
    resume: Path | None = None,
    kl: bool = False,
) -> tuple[dict[str, torch.Tensor], list[float], object]:
    """The learner of ``backend`` after one step per batch: (full weights, [loss, norm, ...], learner);
    with ``kl``, the KL term of ``KL`` and [loss, norm, kl, kl_coef, ...]."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, SPEC)
    if ranks.distributed or backend == "fsdp":
        init_group(ranks)
    name, deepspeed = backend, None
    if backend.startswith("deepspeed"):
        name, deepspeed = "deepspeed", DeepSpeedOptions(zero_stage=int(backend.removeprefix("deepspeed")))
    step = replace(STEP, kl=KL) if kl else STEP
    learner = build_learner(name, model, tokenizer.pad_token_id, step, ranks=ranks, deepspeed=deepspeed)
    done = 0
    if resume is not None:
        done = learner.backend.load_shards(resume).version
        learner.version = done
    figures = []
    for index, batch in enumerate(batches(len(tokenizer))):
        if index < done:
            continue
        stats = learner.step(batch)
        figures += [stats.loss, stats.grad_norm]
        if kl:
            figures += [stats.loss_stats["kl"], stats.loss_stats["kl_coef"]]
        if save_after is not None and index + 1 == save_after[0]:
            directory = save_after[1]
            directory.mkdir(parents=True, exist_ok=True)
            learner.backend.save_shards(directory)
            if ranks.leader:
                (directory / "state.json").write_text(TrainerState(index + 1, {}, 0).to_json())
    weights = to_transfer(learner.backend.full_state(), "fp32")  # as the trainer's publisher reads them
    return weights, figures, learner


def main(backend: str, out: str, *options: str) -> None:
    ranks = Ranks.from_env()
    save_after = resume = None
    if "--save-after" in options:
        at = options.index("--save-after")
        save_after = (int(options[at + 1]), Path(options[at + 2]))
    if "--resume" in options:
        resume = Path(options[options.index("--resume") + 1])
    weights, figures, learner = train(backend, ranks, save_after, resume, kl="--kl" in options)
    optimizer = learner.optimizer.state_dict() if backend == "fsdp" else None  # a collective: every rank
    if ranks.leader:
        torch.save({"weights": weights, "figures": figures, "optimizer": optimizer}, out)
    if torch.distributed.is_initialized():
        torch.distributed.barrier()  # no rank leaves the group while another still uses it


if __name__ == "__main__":
    faulthandler.dump_traceback_later(HANG_S, exit=True)
    run_then_exit(lambda: main(*sys.argv[1:]))  # as the trainer's ranks end: no native teardown to hang in
