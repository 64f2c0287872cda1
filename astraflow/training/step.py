"""One policy-gradient optimizer step on a batch of sampled responses (the trainer's compute core).

Batches are laid out as [left-padded prompt | right-padded response], so every response starts in
the same column and the per-token tensors are response-aligned [B, R]; position ids count real
tokens only, exactly as in ``astraflow.engines.sampling``, so a fresh forward pass reproduces the
engine's log-probs. Token log-probs use ``log_softmax(logits / T)`` with the engine's sampling
temperature T (see ``engines/sampling.py``); a different T here would bias every importance ratio.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from transformers import PreTrainedModel

from astraflow.config import KlConfig
from astraflow.core.errors import NonFiniteStepError
from astraflow.engines.sampling import left_pad
from astraflow.training.backends.base import TrainerBackend
from astraflow.training.backends.torch_adamw import TorchBackend
from astraflow.training.distributed import SINGLE, Ranks, all_reduce_sum, share
from astraflow.training.kl import KlPenalty
from astraflow.training.loss import Aggregation, ppo_clip_loss


@dataclass
class PolicyExample:
    """One trained response: what a TrainSample carries, as arrays."""

    prompt_ids: np.ndarray  # [P] int32
    response_ids: np.ndarray  # [R] int32
    behaviour_logprobs: np.ndarray  # [R] float32
    loss_mask: np.ndarray  # [R] uint8
    advantage: float | np.ndarray  # one for every token, or [R] float32: one per token (step-level estimators)

    @property
    def length(self) -> int:
        """Tokens of the row, prompt and response together (what a forward over it runs)."""
        return len(self.prompt_ids) + len(self.response_ids)


def random_examples(vocab: int, count: int, prompt: int, response: int, seed: int = 0) -> list[PolicyExample]:
    """``count`` random responses with alternating advantages: a batch with a gradient, for benchmarks
    and checks that need a step of a given size and no task."""
    rng = np.random.default_rng(seed)
    return [
        PolicyExample(
            prompt_ids=rng.integers(3, vocab, prompt).astype(np.int32),
            response_ids=rng.integers(3, vocab, response).astype(np.int32),
            behaviour_logprobs=np.full(response, -np.log(vocab), dtype=np.float32),
            loss_mask=np.ones(response, dtype=np.uint8),
            advantage=1.0 if index % 2 else -1.0,
        )
        for index in range(count)
    ]


@dataclass
class PolicyBatch:
    """Padded tensors of a list of examples."""

    input_ids: torch.Tensor  # [B, P + R] long
    attention_mask: torch.Tensor  # [B, P + R] long
    position_ids: torch.Tensor  # [B, P + R] long
    response_ids: torch.Tensor  # [B, R] long
    behaviour_logprobs: torch.Tensor  # [B, R] float32
    loss_mask: torch.Tensor  # [B, R] float32, 0 on padding
    advantages: torch.Tensor  # [B] float32, or [B, R] when any example has one advantage per token


def collate(examples: Sequence[PolicyExample], pad_id: int, device: torch.device | str = "cpu") -> PolicyBatch:
    """Pad ``examples`` into one batch (prompts on the left, responses on the right)."""
    prompt_ids, prompt_mask = left_pad([example.prompt_ids for example in examples], pad_id)
    lengths = np.fromiter((len(example.response_ids) for example in examples), dtype=np.int64, count=len(examples))
    rows, width = len(examples), int(lengths.max())
    real = np.arange(width) < lengths[:, None]  # [B, R] row-major, so filled in example order

    def padded(field: str, dtype: type, fill: float) -> torch.Tensor:
        out = np.full((rows, width), fill, dtype=dtype)
        out[real] = np.concatenate([np.asarray(getattr(example, field), dtype=dtype) for example in examples])
        return torch.from_numpy(out)

    response_ids = padded("response_ids", np.int64, pad_id)
    behaviour = padded("behaviour_logprobs", np.float32, 0.0)
    loss_mask = padded("loss_mask", np.float32, 0.0)
    attention = torch.cat([prompt_mask, torch.from_numpy(real.astype(np.int64))], dim=1)
    return PolicyBatch(
        input_ids=torch.cat([prompt_ids, response_ids], dim=1).to(device),
        attention_mask=attention.to(device),
        position_ids=(attention.cumsum(-1) - 1).clamp(min=0).to(device),
        response_ids=response_ids.to(device),
        behaviour_logprobs=behaviour.to(device),
        loss_mask=loss_mask.to(device),
        advantages=advantages(examples, real).to(device),
    )


def advantages(examples: Sequence[PolicyExample], real: np.ndarray) -> torch.Tensor:
    """[B] the examples' advantages; [B, R] (0 on padding) when any of them has one per token."""
    if all(np.ndim(example.advantage) == 0 for example in examples):
        return torch.tensor([float(example.advantage) for example in examples], dtype=torch.float32)
    out = np.zeros(real.shape, dtype=np.float32)
    for row, example in enumerate(examples):
        out[row, : int(real[row].sum())] = example.advantage  # a float fills the row, an array its tokens
    return torch.from_numpy(out)


def response_logprobs(model: PreTrainedModel, batch: PolicyBatch, temperature: float = 1.0) -> torch.Tensor:
    """log_softmax(logits / T) of each response token under ``model``: [B, R], with grad if enabled."""
    width = batch.response_ids.shape[1]
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
        logits_to_keep=width + 1,
    )
    logits = out.logits[:, :-1, :].float() / temperature  # [B, R, V], position t predicts response token t
    return torch.log_softmax(logits, -1).gather(-1, batch.response_ids[..., None]).squeeze(-1)


def lr_factor(step: int, lr_warmup_steps: int, lr_decay_steps: int, min_lr_ratio: float) -> float:
    """Multiplier of the peak lr at optimizer step ``step`` (0-based): linear warm-up, then cosine decay.

    With ``lr_decay_steps`` 0 the lr stays at its peak after warm-up.
    """
    if step < lr_warmup_steps:
        return (step + 1) / lr_warmup_steps
    if not lr_decay_steps:
        return 1.0
    progress = min(1.0, (step - lr_warmup_steps) / lr_decay_steps)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclass
class PolicyStepConfig:
    """Optimizer and loss settings of ``PolicyTrainer``.

    Defaults are the recipe tuned for the 4x128 tiny model on 2-digit addition, 64 prompts x 8
    (benchmarks/prototype_grpo.py): EM 0.30 -> 0.90 in ~320 steps.
    """

    lr: float = 3e-4
    lr_warmup_steps: int = 30  # linear lr warm-up; a fresh AdamW's first steps move every weight by ~lr
    lr_decay_steps: int = 300  # cosine decay to min_lr_ratio * lr over this many steps after warm-up; 0: constant
    min_lr_ratio: float = 0.1
    betas: tuple[float, float] = (0.9, 0.99)
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    temperature: float = 1.0  # must equal the engine's sampling temperature
    decoupled: bool = True  # True: ρ against π_θ (detached) and w against π_b; False: ρ against π_b
    eps_low: float = 0.2
    eps_high: float = 0.2
    max_is_weight: float = 2.0
    aggregation: Aggregation = "token-mean"
    max_tokens: int | None = None  # the constant token budget of "seq-mean-token-sum-norm" (Dr.GRPO)
    micro_batch_size: int | None = None  # split a batch for memory; gradients are unchanged
    kl: KlConfig = field(default_factory=KlConfig)  # a KL term to a reference policy (training/kl.py); off at coef 0


@dataclass
class StepStats:
    """What one optimizer step did; loss-side figures are token-weighted over the micro-batches."""

    version: int  # the weight version the step produced
    loss: float
    grad_norm: float  # before clipping
    lr: float
    sequences: int
    tokens: int
    seconds: float
    loss_stats: dict[str, float] = field(default_factory=dict)


class PolicyTrainer:
    """Holds the model and its AdamW optimizer; ``version`` counts optimizer steps taken.

    The lr of each step is a function of ``version`` (``lr_factor``), not of a scheduler's own
    counter, so a trainer resumed from a checkpoint only needs its version restored. The optimizer
    lives in a ``TrainerBackend`` (``train.backend``: plain torch unless another one is passed).

    With ``config.kl.coef`` above 0 the loss has a KL term to a frozen reference (``training/kl.py``):
    ``reference`` is an unwrapped copy of the weights the policy starts from, which the backend places
    and shards as it holds the policy; without a backend passed in, the trainer copies ``model`` itself.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        pad_id: int,
        config: PolicyStepConfig,
        version: int = 0,
        backend: TrainerBackend | None = None,
        ranks: Ranks = SINGLE,
        reference: torch.nn.Module | None = None,
    ) -> None:
        self.model = model
        self.ranks = ranks
        self.pad_id = pad_id
        self.config = config
        self.version = version
        self.kl: KlPenalty | None = None
        if config.kl.coef > 0.0 and reference is None and backend is None:
            reference = copy.deepcopy(model)
        elif config.kl.coef > 0.0 and reference is None:
            raise ValueError("a KL term needs a copy of the starting weights made before the backend wrapped them")
        self.backend = backend or TorchBackend(
            model, config.lr, config.betas, config.weight_decay, config.max_grad_norm
        )
        self.optimizer = self.backend.optimizer
        if config.kl.coef > 0.0:
            self.kl = KlPenalty(config.kl, self.backend.frozen(reference), self.backend)

    @property
    def kl_coef(self) -> float | None:
        """β of the next step's KL term; ``None`` without one (what a checkpoint keeps of it)."""
        return None if self.kl is None else self.kl.coefficient.value

    def resume_kl(self, coef: float | None) -> None:
        """After a checkpoint is loaded into the model: its β (``coef``), and a ``sync`` reference re-synced to
        the restored weights (``KlPenalty.resume``)."""
        if self.kl is not None:
            self.kl.resume(coef)

    def step(self, examples: Sequence[PolicyExample]) -> StepStats:
        """One optimizer step on all of ``examples`` (split into micro-batches if configured).

        With several ranks every rank passes the whole batch, in the same order, and trains its share
        (``distributed.share``); the gradients are the whole batch's, as with one rank (``_parts``).
        ``NonFiniteStepError`` when the loss or the gradient norm is not finite (on any rank: every
        rank raises it): then the weights, the optimizer state and ``version`` are left as they were.
        """
        if not examples:
            raise ValueError("PolicyTrainer.step needs at least one example")
        started = time.perf_counter()
        config = self.config
        ranks = self.ranks
        self.model.train()
        self.backend.zero_grad()
        tokens = float(sum(int(np.sum(example.loss_mask)) for example in examples))
        denominator = tokens if config.aggregation == "token-mean" else float(len(examples))
        total_loss, weighted = 0.0, dict[str, float]()
        parts = self._parts(examples)
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            with self.backend.accumulating(last):
                batch = collate(part, self.pad_id, self.model.device)
                if self.kl is not None:  # the reference's forward first: it keeps no activations
                    with torch.no_grad():
                        reference_logprobs = response_logprobs(self.kl.reference, batch, config.temperature)
                logprobs = response_logprobs(self.backend.module, batch, config.temperature)
                loss, stats = ppo_clip_loss(
                    logprobs,
                    batch.behaviour_logprobs,
                    batch.advantages,
                    batch.loss_mask,
                    proximal_logprobs=None if config.decoupled else batch.behaviour_logprobs,
                    eps_low=config.eps_low,
                    eps_high=config.eps_high,
                    max_is_weight=config.max_is_weight,
                    aggregation=config.aggregation,
                    denominator=max(denominator, 1.0),
                    max_tokens=config.max_tokens,
                )
                if self.kl is not None:
                    term, kl_sum = self.kl.term(
                        logprobs,
                        reference_logprobs,
                        batch.loss_mask,
                        config.aggregation,
                        max(denominator, 1.0),
                        config.max_tokens,
                    )
                    loss = loss + term
                    weighted["kl"] = weighted.get("kl", 0.0) + kl_sum
                (part_loss,) = all_reduce_sum([float(loss.detach())], ranks)
                total_loss += part_loss
                if not math.isfinite(total_loss):  # its gradient would be too: stop before it reaches the weights
                    self.backend.zero_grad()
                    raise NonFiniteStepError(f"loss {total_loss} is not finite (version {self.version}, step skipped)")
                # backends average gradients over the ranks; each rank's loss is its share of the batch's
                self.backend.backward(loss * ranks.world_size if ranks.distributed else loss, last=last)
            for name, value in vars(stats).items():
                weighted[name] = weighted.get(name, 0.0) + value * stats.tokens
        if ranks.distributed:  # token-weighted sums of every rank's figures
            names = sorted(weighted)
            weighted = dict(zip(names, all_reduce_sum([weighted[name] for name in names], ranks)))
        lr = config.lr * lr_factor(self.version, config.lr_warmup_steps, config.lr_decay_steps, config.min_lr_ratio)
        grad_norm = self.backend.step(lr)
        if not math.isfinite(grad_norm):  # the backend left the weights and optimizer state as they were
            raise NonFiniteStepError(f"gradient norm {grad_norm} is not finite (version {self.version}, step skipped)")
        self.version += 1
        loss_stats = {name: value / max(tokens, 1.0) for name, value in weighted.items() if name != "tokens"}
        if self.kl is not None:
            loss_stats["kl_coef"] = self.kl.coefficient.value  # the β of this step, before it adapts
            self.kl.after_step(self.version, loss_stats["kl"], len(examples))
        return StepStats(
            version=self.version,
            loss=total_loss,
            grad_norm=float(grad_norm),
            lr=lr,
            sequences=len(examples),
            tokens=int(tokens),
            seconds=time.perf_counter() - started,
            loss_stats=loss_stats,
        )

    def _parts(self, examples: Sequence[PolicyExample]) -> list[Sequence[PolicyExample]]:
        """The micro-batches this rank runs: its share of ``examples``, cut into ``micro_batch_size``.

        Every rank runs the same number of them (FSDP2 gathers weights in each forward, a collective),
        the number the largest share needs; a rank whose share runs out runs a muted copy of the
        batch's first example, whose zero loss mask adds nothing to the loss or the gradients. The
        loss of each is divided by the whole batch's token (or sequence) count, so the summed
        gradients of all parts of all ranks are the gradient of the whole batch. Cut, the share is
        ordered by length first: each micro-batch is padded to its own longest sequence, and
        multi-turn episodes of very different lengths then waste little on padding.
        """
        ranks = self.ranks
        mine = [examples[index] for index in share(len(examples), ranks.rank, ranks.world_size)]
        largest = len(share(len(examples), 0, ranks.world_size))
        size = self.config.micro_batch_size or largest
        if size < len(mine):
            mine.sort(key=lambda example: example.length)
        count = math.ceil(largest / size)
        muted = replace(examples[0], loss_mask=np.zeros_like(examples[0].loss_mask), advantage=0.0)
        return [mine[start : start + size] or [muted] for start in range(0, count * size, size)]
