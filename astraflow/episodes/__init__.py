"""How a policy plays a task, shared by the rollout producers and the evaluators: the workflows
(``workflows``), the multi-turn loop (``loop``) and held-out scoring (``heldout``, ``judged``).

A change to how a policy plays a task is made here, once, for both."""
