"""The soak: slice loop, window aggregation, watchdog rules, canary, stall and memory figures, disk watch."""
