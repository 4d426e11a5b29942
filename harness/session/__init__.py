"""One engine's life in a run: start, wait, observe, stop; the run's observers; the context-fill check."""
