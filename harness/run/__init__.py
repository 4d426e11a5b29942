"""A run from start to finish: the runner, its progress, resume, verify and the plan."""
