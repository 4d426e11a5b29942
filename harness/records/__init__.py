"""The run folder's records: crash-safe JSONL writers and readers, the manifest, columnar twins."""
