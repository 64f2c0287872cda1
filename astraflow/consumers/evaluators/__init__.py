"""The evaluators: score each policy's newest weights (``policy``) and the policies together
(``system``) on held-out problems, through the same episode code the producers run."""
