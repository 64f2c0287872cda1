"""A bare PyTorch policy-gradient step: the reference AstraFlow's train step is measured against (issue #25).

Standalone on purpose: it imports torch, numpy and transformers, nothing of the project, so what it
times is what the step costs with no framework around it. It loads a causal LM from a local
checkpoint folder (``from_pretrained``), reads a batch from an ``.npz`` file (written by
``benchmarks/train_step.py``: ``prompt_ids``/``prompt_lengths``, ``response_ids``/
``response_lengths``, ``behaviour_logprobs``, ``advantages``), and times ``--reps`` steps of:

- one forward pass over [left-padded prompt | right-padded response] with position ids that count
  real tokens, keeping the logits of the response positions only;
- token log-probs ``log_softmax(logits / T)`` of the sampled tokens;
- the decoupled PPO-clip loss with π_old = π_θ detached (ratio 1, truncated importance weight
  against the behaviour log-probs, cap 2), summed over response tokens and divided by their count;
- backward, gradient clipping at global norm 1, one AdamW step.

    python benchmarks/bare_step.py --model DIR --batch FILE.npz [--threads 2] [--reps 10]

Prints one JSON line: the median step seconds over the repetitions after a warm-up step, and the
loss of the first step (so a harness can check both sides computed the same thing).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch
from transformers import AutoModelForCausalLM


def load_batch(path: str, pad_id: int) -> dict[str, torch.Tensor]:
    data = np.load(path)
    rows = len(data["advantages"])
    prompt_width = int(data["prompt_lengths"].max())
    response_width = int(data["response_lengths"].max())
    input_ids = torch.full((rows, prompt_width + response_width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    response_ids = torch.full((rows, response_width), pad_id, dtype=torch.long)
    behaviour = torch.zeros((rows, response_width))
    mask = torch.zeros((rows, response_width))
    for row in range(rows):
        p, r = int(data["prompt_lengths"][row]), int(data["response_lengths"][row])
        start, end = prompt_width - p, prompt_width + r
        input_ids[row, start:prompt_width] = torch.from_numpy(data["prompt_ids"][row, :p].astype(np.int64))
        input_ids[row, prompt_width:end] = torch.from_numpy(data["response_ids"][row, :r].astype(np.int64))
        attention[row, start:end] = 1
        response_ids[row, :r] = input_ids[row, prompt_width:end]
        behaviour[row, :r] = torch.from_numpy(data["behaviour_logprobs"][row, :r])
        mask[row, :r] = 1.0
    return {
        "input_ids": input_ids,
        "attention_mask": attention,
        "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
        "response_ids": response_ids,
        "behaviour": behaviour,
        "mask": mask,
        "advantages": torch.from_numpy(data["advantages"].astype(np.float32)),
    }


def step(model, optimizer, batch: dict[str, torch.Tensor], temperature: float = 1.0) -> float:
    width = batch["response_ids"].shape[1]
    logits = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
        use_cache=False,
        logits_to_keep=width + 1,
    ).logits[:, :-1, :]
    logprobs = torch.log_softmax(logits.float() / temperature, -1).gather(-1, batch["response_ids"][..., None])[..., 0]
    ratio = torch.exp(logprobs - logprobs.detach())
    weight = torch.exp(logprobs.detach() - batch["behaviour"]).clamp(max=2.0)
    advantages = batch["advantages"][:, None]
    surrogate = torch.minimum(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages)
    loss = -(weight * surrogate * batch["mask"]).sum() / batch["mask"].sum().clamp(min=1.0)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return float(loss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--lr", type=float, default=3e-4)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.99), weight_decay=0.0)
    batch = load_batch(args.batch, model.config.pad_token_id)
    first_loss = step(model, optimizer, batch)  # warm-up: allocators, AdamW's state
    seconds = []
    for _ in range(args.reps):
        started = time.perf_counter()
        step(model, optimizer, batch)
        seconds.append(time.perf_counter() - started)
    print(json.dumps({"step_s": statistics.median(seconds), "first_loss": first_loss, "reps": args.reps}))


if __name__ == "__main__":
    main()
