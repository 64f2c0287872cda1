"""Task datasets and their reward functions (light: no torch, so the task feeder imports them fast)."""
