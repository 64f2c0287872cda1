"""Workflows: what a rollout producer does with a batch of tasks, policy by policy.

``base`` holds the contract (``Workflow``, ``TaskOutcome``, ``make_trajectory``), ``single_turn``,
``multiturn`` and ``collab`` (one policy answers, another judges) the workflows, and ``factory``
builds the one a run config names.
"""
