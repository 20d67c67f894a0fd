"""Serving: the `vllm serve` command for a target with its DSpark draft (`launch.py`)."""
