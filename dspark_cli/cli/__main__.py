"""`python -m dspark_cli.cli ...`: what torchrun's children run (training/distributed.py)."""

from dspark_cli.cli import entrypoint

entrypoint()
