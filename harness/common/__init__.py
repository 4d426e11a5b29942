"""Leaf helpers every layer may use: errors, safe JSON, statistics, packaged files, ports."""
