"""Engines and trainer backends are chosen by config; checkpoints load as real ones do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from astraflow.basemodel.tiny import TinyModelSpec, build_char_tokenizer, build_tiny_model, create_tiny_checkpoint
from astraflow.config import EngineConfig, parse_config
from astraflow.core.errors import ConfigError
from astraflow.engines import build_engine
from astraflow.engines.loading import load_policy, load_tokenizer, resolve_dtype
from astraflow.engines.torch_engine import TorchEngine

SMALL = TinyModelSpec(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
TEMPLATE = "{% for m in messages %}<{{ m['content'] }}>{% endfor %}{% if add_generation_prompt %}={% endif %}"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "policy", SMALL)


def test_torch_engine_is_built_from_config(checkpoint: Path) -> None:
    engine = build_engine(
        parse_config({"engine": {"type": "torch", "device": "auto", "dtype": "auto"}}).engine, checkpoint, seed=0
    )
    assert isinstance(engine, TorchEngine) and engine.refreshable and engine.version == 0
    expected = torch.float32 if engine.model.device.type == "cpu" else resolve_dtype("auto", "cuda")
    assert engine.model.dtype == expected
    (generation,) = engine.generate(["1+2="], n=1, max_new_tokens=3, temperature=1.0)[0]
    assert len(generation.response_ids) == len(generation.logprobs) > 0


@pytest.mark.parametrize(
    ("flag", "template", "encoded"), [(True, TEMPLATE, "<12+3>="), (False, TEMPLATE, "12+3"), (True, None, "12+3")]
)
def test_chat_template_applies_only_when_asked_and_present(flag: bool, template: str | None, encoded: str) -> None:
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = template
    engine = TorchEngine(build_tiny_model(tokenizer, SMALL), tokenizer, seed=0, chat_template=flag)
    assert engine.encode(["12+3"])[0].tolist() == tokenizer(encoded)["input_ids"]
    assert (
        engine.generate(["12+3"], n=2, max_new_tokens=2, temperature=1.0)[0][0].prompt_ids.tolist()
        == tokenizer(encoded)["input_ids"]
    )


def test_a_checkpoint_without_pad_token_pads_with_eos(tmp_path: Path) -> None:
    path = create_tiny_checkpoint(tmp_path / "policy", SMALL)
    config = json.loads((path / "tokenizer_config.json").read_text())
    config.pop("pad_token")
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = load_tokenizer(path)
    assert tokenizer.pad_token_id == tokenizer.eos_token_id and tokenizer.padding_side == "left"


def test_bf16_checkpoint_loads_in_the_asked_dtype(tmp_path: Path) -> None:
    tokenizer = build_char_tokenizer()
    build_tiny_model(tokenizer, SMALL).to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    tokenizer.save_pretrained(tmp_path / "bf16")
    assert load_policy(tmp_path / "bf16", dtype="bfloat16")[0].dtype == torch.bfloat16
    assert load_policy(tmp_path / "bf16", dtype="auto")[0].dtype == torch.float32  # CPU: widened


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"engine": {"type": "openai"}}, "openai.base_url"),
        (
            {"engine": {"type": "openai", "openai": {"base_url": "http://x/v1", "weight_update": "sglang_disk"}}},
            "update_dir",
        ),
        ({"engine": {"type": "tgi"}}, "engine.type"),
        ({"train": {"backend": "megatron"}}, "train.backend"),
        ({"train": {"deepspeed": {"zero_stage": 4}}}, "train.deepspeed.zero_stage"),
        ({"train": {"deepspeed": {"zero_stage": 3, "offload_optimizer": True}}}, "offload_optimizer with zero_stage 3"),
        ({"train": {"deepspeed": {"zero_stage": 0, "offload_optimizer": True}}}, "offload_optimizer needs zero_stage"),
    ],
)
def test_bad_engine_and_backend_config_names_the_field(raw: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        parse_config(raw)


OPENAI = {"type": "openai", "openai": {"base_url": "http://x/v1"}}


@pytest.mark.parametrize(
    ("raw", "policy"),
    [
        ({"engine": OPENAI}, "main"),
        ({"engine": {**OPENAI, "openai": {**OPENAI["openai"], "weight_update": "none"}}}, "main"),
        ({"policies": {"solver": {}, "critic": {"engine": OPENAI}}}, "critic"),
    ],
)
def test_a_run_refuses_an_engine_that_never_takes_new_weights(raw: dict, policy: str) -> None:
    with pytest.raises(ConfigError, match=rf"engine\.openai\.weight_update: 'none' \(policy '{policy}'\).*sglang_disk"):
        parse_config(raw)


def test_an_engine_that_takes_new_weights_or_serves_outside_a_run_is_valid() -> None:
    disk = {**OPENAI, "openai": {**OPENAI["openai"], "weight_update": "sglang_disk", "update_dir": "/srv/w"}}
    assert parse_config({"engine": disk}).engine.openai.weight_update == "sglang_disk"
    assert parse_config({"policies": {"solver": {"engine": disk}, "critic": {}}}).for_policy("solver").engine.type == (
        "openai"
    )
    assert EngineConfig.model_validate(OPENAI).openai.weight_update == "none"  # fixed weights, e.g. to evaluate
