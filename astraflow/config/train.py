"""The ``train`` section: the trainer's optimizer, its loss (``train.loss``), its KL term to a reference policy
(``train.kl``), its backends (DeepSpeed, FSDP2, simulated) and how many ranks train together (``train.world_size``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from astraflow.config.base import Section

Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
"""How the token losses of a batch become one loss (``train.loss.aggregation``; ``training/loss.py``)."""

Beta = Annotated[float, Field(ge=0.0, lt=1.0)]

KlEstimator = Literal["k1", "k2", "k3", "low_var_kl"]
"""The per-token estimate of KL(π_θ ‖ π_ref) of ``train.kl.estimator`` (``training/kl.py``)."""


class DeepSpeedOptions(Section):
    zero_stage: int = Field(default=2, ge=0, le=3)
    """ZeRO stage: 0 (plain data parallel, one rank only), 1 (optimizer states sharded over the ranks),
    2 (and gradients), 3 (and the weights themselves)."""
    offload_optimizer: bool = False
    """Keep the optimizer states on the CPU and step them there (DeepSpeedCPUAdam, compiled on first use)."""
    mixed_precision: Literal["auto", "bf16", "off"] = "auto"
    (
        "``auto``: DeepSpeed's bf16 mode (bf16 weights and compute, ZeRO's fp32 master partition and optimizer "
        "states) where the device supports bf16 (a CUDA GPU), fp32 elsewhere (CPU); ``bf16``: that mode on any "
        "device, the CPU included; ``off``: fp32 everywhere."
    )

    @model_validator(mode="after")
    def _offload_needs_zero(self) -> "DeepSpeedOptions":
        if self.offload_optimizer and self.zero_stage == 0:
            raise ValueError("offload_optimizer needs zero_stage 1 or 2")
        if self.offload_optimizer and self.zero_stage == 3:
            raise ValueError("offload_optimizer with zero_stage 3 is not supported here; use stage 1 or 2")
        return self


class FsdpOptions(Section):
    """``fsdp``: PyTorch FSDP2 (``fully_shard``): parameters, gradients and optimizer states sharded over the ranks."""

    mixed_precision: Literal["auto", "off"] = "auto"
    (
        "``auto``: compute in bf16 with fp32 gradient reduction where the device supports bf16 (a CUDA GPU), "
        "fp32 elsewhere (CPU); ``off``: fp32 everywhere. The sharded master weights and optimizer states are fp32 "
        "either way."
    )


class SimulatedTrainerOptions(Section):
    """``simulated``: the time model of one trainer, for capacity planning (docs/simulated_cluster.md).

    A step takes ``step_seconds + Σ (sample_seconds + tokens · token_seconds) / devices`` over its
    samples (prompt and response tokens), slept at ``time_scale``; the weights stay the base's and are
    published as usual. Defaults stand for an 8B model on H100s (order of magnitude, not a measurement).
    """

    devices: int = Field(default=2, ge=1, le=65536)
    """GPUs the trainer stands for (data parallel, ideal scaling)."""
    sample_seconds: float = Field(default=0.0, ge=0.0, le=3600.0)
    """Seconds of one sample on one device, whatever its length."""
    token_seconds: float = Field(default=0.00016, ge=0.0, le=60.0)
    """Seconds of one token on one device: forward and backward, and the forward that scores the old log-probs."""
    step_seconds: float = Field(default=1.0, ge=0.0, le=3600.0)
    """Seconds of each step whatever its size: optimizer update, gradient all-reduce."""
    time_scale: float = Field(default=1.0, gt=0.0, le=1000.0)
    """Wall seconds slept per simulated second; must equal ``engine.simulated.time_scale`` when both are simulated."""


class LossConfig(Section):
    """``train.loss``: the loss and optimizer options of the learner that the top of ``train`` does not hold.

    The learner takes them as they are: the field names are those of ``PolicyStepConfig``
    (``training/step.py``), built by ``training.learner.step_config``. The defaults are the trainer's.
    """

    aggregation: Aggregation = "token-mean"
    (
        "How token losses become the batch loss: ``token-mean`` (DAPO: their sum divided by the batch's trained "
        "tokens), ``seq-mean-token-mean`` (GRPO: each response's mean, averaged over responses) or "
        "``seq-mean-token-sum-norm`` (Dr.GRPO: their sum divided by responses × ``max_tokens``, a constant)."
    )
    max_tokens: int | None = Field(default=None, ge=1, le=10_000_000)
    (
        "The constant token budget of ``seq-mean-token-sum-norm`` (other aggregations ignore it); unset: the policy's "
        "``rollout.max_new_tokens``. Never the padded width of a batch, which depends on its longest response."
    )
    max_is_weight: float = Field(default=2.0, ge=1.0, le=1_000_000.0)
    """Truncation C of the importance weight π_old / π_b that corrects stale samples (1: never weighted up)."""
    decoupled: bool = True
    (
        "``true``: decoupled PPO (AReaL): the clipped ratio against π_θ itself, the importance weight against the "
        "behaviour policy π_b; ``false``: the classic PPO clip of π_θ / π_b (as TRL and prime-rl)."
    )
    betas: tuple[Beta, Beta] = (0.9, 0.99)
    """AdamW's (β1, β2), each in [0, 1)."""
    micro_batch_size: int | None = Field(default=None, ge=1)
    (
        "Samples per forward/backward pass when a step's batch is split to bound memory; the gradient is the whole "
        "batch's. Unset: one pass over the batch."
    )


class AdaptiveKlOptions(Section):
    """``train.kl.adaptive``: a coefficient steered toward a target KL (Ziegler et al. 2019; verl's ``kl_ctrl``
    of type ``adaptive``). After each step β ← β · (1 + clip(KL / target − 1, −0.2, 0.2) · samples / horizon),
    KL being the step's mean estimate per trained token and samples its batch's."""

    target: float = Field(default=0.1, gt=0.0, le=100.0)
    """The KL per trained token (nats, as ``train.kl.estimator`` estimates it) the coefficient steers toward
    (verl's ``target_kl``)."""
    horizon: int = Field(default=10_000, ge=1, le=100_000_000)
    """Samples over which a KL off target by 20% or more moves the coefficient by about a factor e^0.2 (verl's
    ``horizon``)."""


class KlConfig(Section):
    """``train.kl``: a KL penalty to a reference policy in the trainer's loss (docs/algorithms.md, "KL to a
    reference policy").

    loss = policy loss + β · (the per-token estimate of KL(π_θ ‖ π_ref), masked and aggregated as the policy
    loss). The reference's log-probs take one more forward pass per micro-batch, without gradients, through
    a frozen copy of the model that each rank holds as it holds the policy (sharded alike under FSDP2 and
    ZeRO-3). The simulated backend computes no loss and ignores it.
    """

    coef: float = Field(default=0.0, ge=0.0, le=1000.0)
    """β, the coefficient of the KL term (TRL's ``beta``, verl's ``kl_loss_coef``); 0 turns the term off and
    builds no reference model. With ``adaptive`` it is the starting value."""
    estimator: KlEstimator = "k3"
    (
        'The per-token estimate, with log r = log π_ref − log π_θ (Schulman, "Approximating KL Divergence"): '
        "``k1`` (−log r), ``k2`` (½ (log r)²), ``k3`` ((r − 1) − log r, TRL's) or ``low_var_kl`` (verl's: k3 "
        "clamped to [−10, 10])."
    )
    reference: Literal["base", "sync"] = "base"
    (
        "``base``: the base checkpoint the run started from, for the whole run; ``sync``: the policy itself, "
        "re-synced every ``sync_every`` versions (TRL's ``sync_ref_model``). After a restart a ``sync`` reference "
        "starts again from the restored weights."
    )
    sync_every: int | None = Field(default=None, ge=1, le=1_000_000)
    """With ``reference: sync``: the reference is re-synced after every version that is a multiple of it
    (TRL's ``ref_model_sync_steps``, in versions)."""
    sync_mixup: float = Field(default=1.0, gt=0.0, le=1.0)
    """With ``reference: sync``: a sync sets π_ref ← α π_θ + (1 − α) π_ref, weight by weight (TRL's
    ``ref_model_mixup_alpha``, whose default is 0.6); 1 copies the policy."""
    adaptive: AdaptiveKlOptions | None = None
    """Steer the coefficient toward a target KL (``train.kl.adaptive``); unset: β stays ``coef``."""

    @model_validator(mode="after")
    def _options_fit_the_reference(self) -> "KlConfig":
        if self.reference == "sync" and self.sync_every is None:
            raise ValueError("train.kl.sync_every: reference 'sync' needs it (the versions between two syncs)")
        given = [name for name, unset in (("sync_every", None), ("sync_mixup", 1.0)) if getattr(self, name) != unset]
        if self.reference == "base" and given:
            raise ValueError(f"train.kl.{given[0]}: only reference 'sync' is re-synced; reference is 'base'")
        if self.adaptive is not None and self.coef == 0.0:
            raise ValueError("train.kl.adaptive: needs train.kl.coef above 0 (its starting value; 0 never moves)")
        return self


class TrainConfig(Section):
    batch_samples: int = Field(default=256, ge=1, le=16384)
    """Samples (responses) per optimizer step; groups are never split across steps. At most 16,384: a
    version's ledger entry names every sample id of its batch, and must fit its topic (16 MiB)."""
    lr: float = Field(default=3e-4, ge=0.0, le=1.0)
    """Peak AdamW learning rate; 0 makes a control run whose versions never change the weights (a
    learning test must fail on it)."""
    lr_warmup_versions: int = Field(default=30, ge=0)
    """Linear learning-rate warm-up over this many versions (optimizer steps)."""
    lr_decay_versions: int = Field(default=300, ge=0)
    """Cosine decay to ``min_lr_ratio * lr`` over this many versions after warm-up; 0 keeps it constant."""
    min_lr_ratio: float = Field(default=0.1, ge=0.0, le=1.0)
    """Floor of the cosine decay, as a fraction of ``lr``."""
    weight_decay: float = Field(default=0.0, ge=0.0)
    """AdamW weight decay."""
    clip_low: float = Field(default=0.2, ge=0.0, le=1.0)
    """PPO clip ε below 1."""
    clip_high: float = Field(default=0.2, ge=0.0, le=10.0)
    """PPO clip ε above 1 (raise it for DAPO's clip-higher, e.g. 0.28)."""
    max_grad_norm: float = Field(default=1.0, gt=0.0)
    """Gradient clipping by global norm."""
    checkpoint_every: int = Field(default=10, ge=1)
    """Versions between atomic checkpoints (model, optimizer, consumed offsets, version)."""
    threads: int = Field(default=1, ge=1, le=256)
    """torch intra-op threads of the trainer process."""
    backend: Literal["torch", "fsdp", "deepspeed", "simulated"] = "torch"
    (
        "Optimizer backend: ``torch`` (AdamW in this process; DDP when ``world_size`` > 1), ``fsdp`` (PyTorch FSDP2, "
        "``train.fsdp``), ``deepspeed`` (ZeRO, ``train.deepspeed``; on CPU with gloo) or ``simulated`` (no compute: "
        "each step takes the time of ``train.simulated``; capacity planning)."
    )
    world_size: int = Field(default=1, ge=1, le=1024)
    (
        "Trainer ranks on this machine: above 1, ``astraflow train`` (and so ``astraflow run``) starts the trainer "
        "through PyTorch's elastic launcher (``torch.distributed.run``; gloo on CPU, NCCL on CUDA GPUs) and each rank "
        "trains its share of every batch; rank 0 alone reads the samples and writes to the log. "
        "``astraflow train --nproc`` overrides it (with ``--nnodes`` for several machines)."
    )
    deepspeed: DeepSpeedOptions = DeepSpeedOptions()
    fsdp: FsdpOptions = FsdpOptions()
    simulated: SimulatedTrainerOptions = SimulatedTrainerOptions()
    loss: LossConfig = LossConfig()
    """Aggregation, importance-weight cap, decoupling, AdamW betas and micro-batches (docs/algorithms.md#losses)."""
    kl: KlConfig = KlConfig()
    """A KL penalty to a reference policy: coefficient, estimator, reference, adaptive coefficient; off by default."""

    @model_validator(mode="after")
    def _ranks_have_a_backend(self) -> "TrainConfig":
        if self.world_size > 1 and self.backend == "simulated":
            hint = "train.simulated.devices models data-parallel GPUs"
            raise ValueError(f"train.world_size: {self.world_size} ranks of backend {self.backend!r}: {hint}")
        if self.world_size > 1 and self.backend == "deepspeed" and self.deepspeed.zero_stage == 0:
            raise ValueError(
                f"train.world_size: {self.world_size} ranks of backend 'deepspeed' need train.deepspeed.zero_stage "
                "1, 2 or 3 (stage 0 is plain data parallel: use train.backend 'torch', which is DDP)"
            )
        return self
