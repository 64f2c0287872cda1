"""Model-side compute shared by every component that runs a policy.

``tiny`` builds a character-level tokenizer and a small Qwen2 from a config (tests, examples and
benchmarks train one from scratch on this machine); ``loading`` loads any local checkpoint;
``sampling`` is the batched KV-cache decoding loop behind the torch engine and the evaluators;
``evaluation`` scores greedy decodes against references. These modules import torch at the top:
only compute code imports them, never the log or schema layers.
"""
