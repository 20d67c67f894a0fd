"""`python -m dspark_cli.cli ...`: the CLI as a module, the `dspark` script's twin (torchrun's children run
`python -m dspark_cli.training`, training/__main__.py)."""

from dspark_cli.cli import entrypoint

entrypoint()
