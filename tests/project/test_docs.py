"""The generated reference pages match the code, and the README's commands exist."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dspark_cli.recipe.docs import recipe_reference

ROOT = Path(__file__).resolve().parents[2]


def test_recipe_reference_is_up_to_date():
    assert (ROOT / "docs/recipe.md").read_text() == recipe_reference(), (
        "docs/recipe.md is stale: run `python -m dspark_cli.recipe.docs > docs/recipe.md`"
    )


def test_cli_reference_is_up_to_date(tmp_path):
    out = tmp_path / "cli.md"
    typer_bin = Path(sys.executable).with_name("typer")
    subprocess.run(
        [str(typer_bin), "dspark_cli.cli", "utils", "docs", "--name", "dspark", "--output", str(out)],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    assert (ROOT / "docs/cli.md").read_text() == out.read_text(), (
        "docs/cli.md is stale: run `typer dspark_cli.cli utils docs --name dspark --output docs/cli.md`"
    )


def test_readme_has_the_two_setup_commands():
    readme = (ROOT / "README.md").read_text()
    assert "bash scripts/dev.sh demo" in readme and "bash scripts/dev.sh test" in readme
    assert (ROOT / ".ci/run").read_text().strip().endswith('scripts/dev.sh" test')
