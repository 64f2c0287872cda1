"""Workflows: what is done with a batch of tasks, policy by policy, by a rollout producer (which
writes the trajectories) and by the task feeder (which reads off ``factory.build_run_workflow`` the
policies a run has and each one's groups per task).

``base`` holds the contract (``Workflow``, ``TaskOutcome``, ``make_trajectory``), ``single_turn``,
``multiturn`` and ``collab`` (one policy answers, another judges) the workflows, and ``factory``
builds the one a run config names.
"""
