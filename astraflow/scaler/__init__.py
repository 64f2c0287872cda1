"""The autoscaler component: how many rollout producers the trainer needs, from what the log shows."""
