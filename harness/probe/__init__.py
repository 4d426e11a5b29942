"""What the harness measures about the machine and the engine's processes: CPU, memory, GPU, bandwidth."""
