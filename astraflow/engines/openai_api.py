"""An engine over any OpenAI-compatible server: ``POST {base_url}/completions`` with log-probs.

RL needs three things a chat client does not: the exact token ids of each response (a decode →
re-encode round trip may change them), the behaviour log-prob of every sampled token, and prompts
sent as token ids (multi-turn episodes continue exact contexts). Requests therefore carry a
token-id ``prompt``, ``logprobs: 1``, and vLLM's extensions ``return_tokens_as_token_ids`` (each
returned token spelled ``token_id:N``) and ``return_token_ids``. Where the server cannot give
these, the engine refuses it when it is built, with the reason (``EngineError``), never falling
back to re-tokenised text or made-up log-probs. Two probes decide it, before any rollout:

1. a plain OpenAI request (text prompt, ``logprobs``, one token): the server must return a
   log-prob for the token (``transformers serve`` 5.x returns ``logprobs: null`` here);
2. the token-id request above: the response must name its token ids.

Log-prob convention: the trainer scores tokens with ``log_softmax(logits / T)``. vLLM reports
that with ``--logprobs-mode processed_logprobs``; its default (``raw_logprobs``) agrees only at
T = 1, so serve with that flag when sampling at another temperature.

Weights: with ``weight_update: sglang_disk`` a new version is written as safetensors into
``update_dir`` (which the server must see at the same path) and loaded with SGLang's
``POST /update_weights_from_disk``. Otherwise (``none``) the server's weights are fixed:
``refreshable`` is False, ``load_state_dict`` logs that once, and every trajectory keeps the
version the engine started with, so the stream's staleness filter judges it honestly. That is for
sampling a fixed model (evaluation, benchmarks): a run config refuses it (``RunConfig``), since its
producers would never change version while the trainer publishes new ones.
"""

from __future__ import annotations

import json
import logging
import shutil
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from astraflow.engines.base import Engine, EngineError, TurnSample

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)
TOKEN_ID_PREFIX = "token_id:"


class OpenAIEngine(Engine):
    """Samples from a model served at ``base_url`` (``http://host:port/v1``)."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        base_url: str,
        model: str | None = None,
        version: int = 0,
        chat_template: bool = False,
        timeout_s: float = 120.0,
        max_parallel: int = 16,
        weight_update: str = "none",
        update_dir: Path | None = None,
        checkpoint: Path | None = None,
    ) -> None:
        super().__init__(tokenizer, version, chat_template)
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.max_parallel = max_parallel
        self.weight_update = weight_update
        self.update_dir = update_dir
        self.checkpoint = checkpoint
        self.refreshable = weight_update != "none"
        self._told_fixed = False
        self.model = model or self._served_model()
        self._check_server()

    def _post(self, path: str, body: dict, url: str | None = None) -> dict:
        request = urllib.request.Request(
            url or f"{self.base_url}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise EngineError(f"{self.base_url}{path} answered HTTP {exc.code}: {detail}") from exc
        except (urllib.error.URLError, OSError, json.JSONDecodeError) as exc:
            raise EngineError(f"{self.base_url}{path} cannot be reached or answered garbage: {exc}") from exc

    def _served_model(self) -> str:
        try:
            with urllib.request.urlopen(f"{self.base_url}/models", timeout=self.timeout_s) as response:
                models = json.loads(response.read())["data"]
        except (urllib.error.URLError, OSError, json.JSONDecodeError, KeyError) as exc:
            raise EngineError(
                f"{self.base_url}/models: cannot list the served models ({exc}); set engine.openai.model"
            ) from exc
        if not models:
            raise EngineError(f"{self.base_url}/models lists no model; set engine.openai.model")
        return models[0]["id"]

    def _check_server(self) -> None:
        """The two probes of the module docstring; ``EngineError`` naming what the server lacks."""
        plain = self._post(
            "/completions", {"model": self.model, "prompt": "1", "max_tokens": 1, "temperature": 1.0, "logprobs": 1}
        )
        choice = (plain.get("choices") or [{}])[0]
        if not (choice.get("logprobs") or {}).get("token_logprobs"):
            raise EngineError(
                f"{self.base_url} returns no log-probs for /completions (logprobs={choice.get('logprobs')!r}): "
                "the trainer needs the behaviour log-prob of every token, so this server cannot feed RL "
                "(transformers serve ignores `logprobs`); serve the model with vLLM "
                "(`vllm serve PATH --logprobs-mode processed_logprobs`) or use engine.type torch / vllm"
            )
        probe = self._request(np.asarray(self.encode(["1"])[0], dtype=np.int32), 1, 1, 1.0, False)
        if not probe:
            raise EngineError(f"{self.base_url} returned no choices for a token-id prompt")

    def _request(
        self, context: np.ndarray, n: int, max_new_tokens: int, temperature: float, greedy: bool
    ) -> list[TurnSample]:
        body = {
            "model": self.model,
            "prompt": [int(token) for token in context],
            "n": n,
            "max_tokens": max_new_tokens,
            "temperature": 0.0 if greedy else temperature,
            "logprobs": 1,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
            "skip_special_tokens": False,
        }
        choices = sorted(
            self._post("/completions", body).get("choices") or [], key=lambda choice: choice.get("index", 0)
        )
        return [self._turn(choice) for choice in choices]

    def _turn(self, choice: dict) -> TurnSample:
        logprobs = choice.get("logprobs") or {}
        values = logprobs.get("token_logprobs")
        ids = choice.get("token_ids")
        if ids is None:
            tokens = logprobs.get("tokens") or []
            if not all(isinstance(token, str) and token.startswith(TOKEN_ID_PREFIX) for token in tokens):
                raise EngineError(
                    f"{self.base_url} returns tokens as text, not ids ({tokens[:3]!r}...): "
                    "re-encoding text can change the tokens the policy sampled; "
                    "use a server that honours `return_tokens_as_token_ids` (vLLM)"
                )
            ids = [int(token[len(TOKEN_ID_PREFIX) :]) for token in tokens]
        if values is None or len(values) != len(ids) or any(value is None for value in values):
            raise EngineError(f"{self.base_url} returned {len(ids)} tokens but log-probs {values!r:.200}")
        return TurnSample(
            np.asarray(ids, dtype=np.int32), np.asarray(values, dtype=np.float32), choice.get("finish_reason") == "stop"
        )

    def sample(
        self, contexts: Sequence[np.ndarray], n: int, max_new_tokens: int, temperature: float, greedy: bool
    ) -> list[TurnSample]:
        with ThreadPoolExecutor(max_workers=max(1, min(self.max_parallel, len(contexts)))) as pool:
            groups = list(
                pool.map(lambda context: self._request(context, n, max_new_tokens, temperature, greedy), contexts)
            )
        for context, group in zip(contexts, groups, strict=True):
            if len(group) != n:
                raise EngineError(
                    f"{self.base_url} returned {len(group)} choices for n={n} (context of {len(context)} tokens)"
                )
        return [row for group in groups for row in group]

    def load_state_dict(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        if not self.refreshable:
            if not self._told_fixed:
                logger.warning(
                    "%s serves fixed weights (engine.openai.weight_update: none): trajectories stay at version %d",
                    self.base_url,
                    self.version,
                )
                self._told_fixed = True
            return
        self._update_from_disk(state, version)
        self.version = version

    def _update_from_disk(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """SGLang: write ``{update_dir}/v{version}`` (config + safetensors), ask the server to load it."""
        from safetensors.torch import save_file

        if self.update_dir is None or self.checkpoint is None:
            raise EngineError("engine.openai.weight_update sglang_disk needs update_dir and the base checkpoint")
        target = self.update_dir / f"v{version:08d}"
        target.mkdir(parents=True, exist_ok=True)
        for name in ("config.json", "generation_config.json"):
            if (self.checkpoint / name).is_file():
                shutil.copy(self.checkpoint / name, target / name)
        unique: dict[str, torch.Tensor] = {}
        seen: set[int] = set()
        for name, tensor in state.items():  # tied weights share storage; safetensors stores each once
            if tensor.data_ptr() not in seen:
                seen.add(tensor.data_ptr())
                unique[name] = tensor.detach().contiguous().cpu()
        save_file(unique, str(target / "model.safetensors"))
        root = self.base_url.removesuffix("/v1")
        answer = self._post(
            "/update_weights_from_disk", {"model_path": str(target)}, url=f"{root}/update_weights_from_disk"
        )
        if not answer.get("success", False):
            raise EngineError(
                f"{root}/update_weights_from_disk refused version {version}: {answer.get('message', answer)}"
            )
        for old in sorted(self.update_dir.glob("v*"))[:-1]:
            shutil.rmtree(old, ignore_errors=True)
