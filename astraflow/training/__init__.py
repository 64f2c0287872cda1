"""The trainer's machinery: the PPO-clip loss, one optimizer step, the optimizer backends and checkpoints."""
