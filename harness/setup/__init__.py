"""Installing and checking what a run needs: the engine build, the vLLM environment, doctor."""
