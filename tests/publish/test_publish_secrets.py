"""`dspark publish` never uploads a secret inside a URL: export records the recipe redacted, and publish
refuses a file that still holds one (a draft exported by an older dspark, a card or report written by hand).

Real `dspark publish` processes against the loopback hub (tests/hub_server.py), as in test_publish.py;
the refusals must come before the first request.

    .venv/bin/python -m pytest tests/publish/test_publish_secrets.py -q
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from bench_support import export_random_draft
from hub_server import LoopbackHub
from test_publish import REPO, TOKEN, publish, resign

from dspark_cli.recipe import load_recipe

pytestmark = pytest.mark.slow  # a real `dspark publish` process per case: ~5-10 s each loaded

ENDPOINT = "https://user:s3cret@gen.invalid/v1?api_key=abc123"
STREAM = "s3://AKIAKEY:SECRETKEY@bucket/stream"
SECRETS = ("s3cret", "abc123", "SECRETKEY")


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    root = tmp_path_factory.mktemp("secrets")
    return load_recipe("tiny", [f"output_dir={root}", f"datagen.endpoint={ENDPOINT}", f"capture.stream={STREAM}"])


@pytest.fixture(scope="module")
def exported(recipe) -> Path:
    """A draft exported from a training run whose manifest still carries the secrets (an older dspark's)."""
    return export_random_draft(recipe, Path(recipe.output_dir) / "draft")


def test_export_records_the_drafts_recipe_redacted(exported):
    for name in ("recipe.yaml", "dspark_manifest.json"):
        text = (exported / name).read_text()
        assert not [s for s in SECRETS if s in text], name
        assert "https://user:***@gen.invalid/v1?api_key=***" in text and "s3://AKIAKEY:***@bucket/stream" in text


def leaky_copy(exported: Path, recipe, tmp_path: Path) -> Path:
    """The draft as an older dspark exported it: the recipe with its secrets in recipe.yaml and the manifest."""
    draft = tmp_path / "draft"
    shutil.copytree(exported, draft)
    dumped = recipe.model_dump(mode="json")
    (draft / "recipe.yaml").write_text(yaml.safe_dump(dumped, sort_keys=False))
    manifest = json.loads((draft / "dspark_manifest.json").read_text())
    manifest["recipe"] = dumped
    (draft / "dspark_manifest.json").write_text(json.dumps(manifest))
    resign(draft)
    return draft


def test_a_draft_holding_a_url_secret_is_refused_by_name_before_any_request(exported, recipe, tmp_path):
    draft = leaky_copy(exported, recipe, tmp_path)
    with LoopbackHub(TOKEN) as hub:
        real = publish(str(draft), "--repo-id", REPO, hub=hub, home=tmp_path)
        dry = publish(str(draft), "--repo-id", REPO, "--dry-run", hub=hub, home=tmp_path)
    for out in (real, dry):
        assert out.returncode == 1, out.stdout + out.stderr
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 2, out.stderr  # one error line, one hint
        assert lines[0] == (
            "error: dspark_manifest.json: recipe.datagen.endpoint holds a password and a credential (api_key=) "
            "in 'https://user:***@gen.invalid/v1?api_key=***' (+3 more); nothing was uploaded"
        )
        assert "export the draft again" in lines[1]
        assert not [s for s in SECRETS if s in out.stdout + out.stderr]
    assert hub.requests == [] and hub.repos == {}


def test_a_hand_written_card_with_a_signed_url_is_refused(exported, tmp_path):
    draft = tmp_path / "draft"
    shutil.copytree(exported, draft)
    (draft / "README.md").write_text("# my draft\n\nData: https://bucket.example/d.jsonl?X-Amz-Signature=f00d\n")
    with LoopbackHub(TOKEN) as hub:
        dry = publish(str(draft), "--repo-id", REPO, "--dry-run", hub=hub, home=tmp_path)
    assert dry.returncode == 1, dry.stdout + dry.stderr
    assert dry.stderr.startswith(
        "error: README.md: a URL holds a credential (X-Amz-Signature=) "
        "in 'https://bucket.example/d.jsonl?X-Amz-Signature=***'; nothing was uploaded"
    ), dry.stderr
    assert "f00d" not in dry.stderr and hub.requests == []


def test_a_clean_draft_still_publishes(exported, tmp_path):
    with LoopbackHub(TOKEN) as hub:
        out = publish(str(exported), "--repo-id", REPO, hub=hub, home=tmp_path)
    assert out.returncode == 0, out.stderr
    uploaded = hub.repos[REPO].files
    assert {"recipe.yaml", "dspark_manifest.json", "README.md"} <= set(uploaded)
    assert not [s for name, data in uploaded.items() for s in SECRETS if s.encode() in data]
