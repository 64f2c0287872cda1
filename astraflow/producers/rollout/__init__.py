"""The rollout producer: reads tasks, plays them with the policies' engines and writes
trajectories in one transaction with the tasks' offsets."""
