"""The code task: programs from input/output examples, run by the sandbox as an environment."""
