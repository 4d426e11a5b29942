"""Reports, rebuilt from results folders alone (never from a run's memory)."""
