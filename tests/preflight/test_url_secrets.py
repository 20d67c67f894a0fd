"""Secrets inside URLs in a recipe (a password, an `api_key=`) never reach a recorded recipe, a manifest or a draft.

Real runs: `dspark datagen` (source answers kept, so the endpoint is recorded but never contacted), a tiny
training run and its resume (tests/train_fixtures.py), and `dspark export` of it, then `dspark publish
--dry-run` of the draft. Every file they leave is searched for the secrets byte for byte.

    .venv/bin/python -m pytest tests/preflight/test_url_secrets.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from dspark_cli.cli import app

runner = CliRunner()
SECRETS = ("s3cret", "abc123", "AKIAKEY:SECRETKEY", "pw9", "sig-value", "tok-value")


def secret_overrides(tag: str) -> list[str]:
    """Overrides that put a secret in four URL fields; `tag` makes each test's values its own (a process warns
    once per key and value)."""
    return [
        f"datagen.endpoint=https://user:s3cret@{tag}.invalid/v1?api_key=abc123&n=1",
        f"capture.stream=mooncake://u:pw9@{tag}.invalid:50051/ns",
        f"bench.endpoint=http://{tag}.invalid:8000/v1?X-Amz-Signature=sig-value",
        f"bench.baseline_endpoint=https://{tag}.invalid/v1#access_token=tok-value",
    ]


def leaks(root: Path) -> list[str]:
    """Every file under `root` holding one of SECRETS, with the secret."""
    return [
        f"{path}: {secret}"
        for path in sorted(p for p in root.rglob("*") if p.is_file())
        for secret in SECRETS
        if secret.encode() in path.read_bytes()
    ]


def test_urls_are_redacted_by_their_shape():
    from dspark_cli.recipe.secrets import holds_redacted, redact_tree, redact_url

    cases = {
        "https://user:s3cret@host/v1": "https://user:***@host/v1",
        "s3://AKIA:SECRET@bucket/prefix": "s3://AKIA:***@bucket/prefix",
        "redis://:pw@host:6379/0": "redis://:***@host:6379/0",
        "https://h/x?API_KEY=a&n=1&Token=b": "https://h/x?API_KEY=***&n=1&Token=***",
        "https://h/o?X-Amz-Credential=AK%2F1&X-Amz-Signature=f00&X-Amz-Security-Token=t": (
            "https://h/o?X-Amz-Credential=***&X-Amz-Signature=***&X-Amz-Security-Token=***"
        ),
        "https://acct.blob/c?sv=2024&sig=abc%3D": "https://acct.blob/c?sv=2024&sig=***",
        "https://h/cb#access_token=abc&state=1": "https://h/cb#access_token=***&state=1",
        "https://h/?hf_token=x&private-key=y&passwd=z": "https://h/?hf_token=***&private-key=***&passwd=***",
        "see https://a:b@c.example/x and http://d/?key=e": "see https://a:***@c.example/x and http://d/?key=***",
    }
    for url, redacted in cases.items():
        assert redact_url(url) == redacted, url
        assert holds_redacted(redacted) and not holds_redacted(url), url
    untouched = [
        "mooncake://10.0.0.5:50051/k3-run1?admin_port=9003&segment=512MB&timeout=30",
        "https://user@host/v1",  # a user name alone is no secret
        "https://host/v1?model=m&keyword=k&monkey=1",
        "runs/tiny/train",
        "tiny-prompts",
        "https://user:***@host/v1",  # already redacted: kept, not reported
    ]
    for text in untouched:
        assert redact_url(text) == text, text
    tree, found = redact_tree({"a": {"b": ["x", "https://u:p@h/?sig=s"]}, "n": 3})
    assert tree == {"a": {"b": ["x", "https://u:***@h/?sig=***"]}, "n": 3}
    assert [(f.key, f.what) for f in found] == [("a.b[1]", "a password and a credential (sig=)")]


def test_files_to_upload_are_searched_by_key_or_as_text():
    from dspark_cli.recipe.secrets import find_in_file

    report = {"bench": {"endpoint": "http://h:8000/v1?token=t0k"}, "online": [{"endpoint": "http://u:p@h"}]}
    found = find_in_file("bench/bench.json", json.dumps(report).encode())
    assert [(f.key, f.what, f.shown) for f in found] == [
        ("bench.endpoint", "a credential (token=)", "http://h:8000/v1?token=***"),
        ("online[0].endpoint", "a password", "http://u:***@h"),
    ]
    card = b"Served from http://u:pw@h:8000 and http://h/?model=m.\n"
    assert [(f.key, f.shown) for f in find_in_file("README.md", card)] == [("a URL", "http://u:***@h:8000")]
    assert find_in_file("recipe.yaml", b"datagen: {endpoint: 'https://h/v1?Api-Key=k'}\n")[0].key == "datagen.endpoint"
    assert find_in_file("model.safetensors", b"http://u:p@h") == find_in_file("x.json", b"{}") == []


def test_a_hand_off_file_keeps_the_secrets_for_the_runs_own_processes_only(tmp_path):
    from dspark_cli.recipe import load_recipe, write_resolved

    recipe = load_recipe("tiny", secret_overrides("handoff"))
    record = write_resolved(recipe, tmp_path / "record")
    hand_off = write_resolved(recipe, tmp_path / "hand-off", keep_secrets=True)  # what torchrun ranks load
    assert leaks(tmp_path / "record") == [] and "user:***@handoff.invalid" in record.read_text()
    assert load_recipe(str(hand_off)).datagen.endpoint == recipe.datagen.endpoint
    assert hand_off.stat().st_mode & 0o777 == 0o600


@pytest.mark.slow  # three `dspark datagen` runs on the tiny target's tokenizer: ~15 s loaded
def test_validate_shows_the_recipe_redacted_as_text_and_as_json():
    endpoint = "datagen.endpoint=https://u:pw99@gen.invalid/v1?api_key=zz42"
    for fmt in (["--print"], ["--format", "json"]):
        result = runner.invoke(app, ["validate", "tiny", endpoint, *fmt])
        assert result.exit_code == 0, result.output
        assert "https://u:***@gen.invalid/v1?api_key=***" in result.output
        assert "pw99" not in result.output and "zz42" not in result.output


def test_datagen_records_the_recipe_redacted_warns_once_resumes_and_refuses_a_recorded_secret(tmp_path, caplog):
    tag = f"dg-{tmp_path.name}"
    args = [
        "datagen",
        "tiny",
        f"output_dir={tmp_path / 'run'}",
        "datagen.sources=[{path: tiny-prompts, max_samples: 3}]",
        "datagen.regenerate=false",  # the endpoint is recorded, never contacted
        "datagen.shard_size=2",
        *secret_overrides(tag),
    ]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    data = tmp_path / "run" / "data"
    assert leaks(tmp_path) == []
    recorded = yaml.safe_load((data / "recipe.yaml").read_text())
    assert recorded["datagen"]["endpoint"] == f"https://user:***@{tag}.invalid/v1?api_key=***&n=1"
    assert recorded["capture"]["stream"] == f"mooncake://u:***@{tag}.invalid:50051/ns"
    warning = (
        f"datagen.endpoint holds a password and a credential (api_key=); recorded as "
        f"https://user:***@{tag}.invalid/v1?api_key=***&n=1"
    )
    said = [r.getMessage() for r in caplog.records if r.name == "dspark_cli.recipe.secrets"]
    assert sum(m.startswith(warning) for m in said) == 1, said  # once, though recipe.yaml is written more often
    assert len(said) == 4 and not any(secret in m for m in said for secret in SECRETS)

    again = runner.invoke(app, args)  # the same command resumes: nothing compares the secret
    assert again.exit_code == 0, again.output
    assert "3 conversations" in again.output and leaks(tmp_path) == []

    copied = runner.invoke(app, ["datagen", str(data / "recipe.yaml"), f"output_dir={tmp_path / 'other'}"])
    assert copied.exit_code == 2, copied.output
    assert f"datagen.endpoint: https://user:***@{tag}.invalid/v1?api_key=***&n=1 holds the `***`" in copied.output
    assert "set the real value again (datagen.endpoint=...)" in copied.output
    assert "capture.stream" not in copied.output  # datagen does not open the stream
    assert not (tmp_path / "other").exists()


@pytest.mark.slow  # a tiny training run, its resume, `dspark export` and `dspark publish --dry-run`: ~30 s loaded
def test_training_export_and_publish_keep_no_secret_and_resume(tmp_path):
    import train_fixtures  # here: it puts the checkout first on sys.path

    from dspark_cli.training.run import run_train

    tag = f"tr-{tmp_path.name}"
    work = tmp_path / "w"
    train_fixtures.make_target(work / "target")
    sequences = train_fixtures.make_sequences(work / "target", num=8)
    recipe = train_fixtures.tiny_recipe(
        work, ["train.max_steps=4", "train.checkpoint_every=2", "train.log_every=1", *secret_overrides(tag)]
    )
    run_train(recipe, resume="auto", sequences=lambda: iter(sequences))
    train = work / "run" / "train"
    # a rerun from the step-2 checkpoint, as after a crash: its recorded settings and contract still match
    summary = run_train(recipe, resume=str(train / "checkpoints" / "step-000002"), sequences=lambda: iter(sequences))
    assert summary.steps == 4 and summary.resumed_from.endswith("step-000002")
    assert (train / "checkpoints" / "step-000004" / "recipe.yaml").is_file()
    assert leaks(work) == []
    recorded = yaml.safe_load((train / "recipe.yaml").read_text())
    assert recorded["bench"]["endpoint"] == f"http://{tag}.invalid:8000/v1?X-Amz-Signature=***"
    assert recorded["bench"]["baseline_endpoint"] == f"https://{tag}.invalid/v1#access_token=***"

    # a run recorded by an older dspark kept the secrets in its recipe.yaml: the export records them redacted
    (train / "recipe.yaml").write_text(yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False))
    draft = work / "draft"
    exported = runner.invoke(app, ["export", str(train), "-o", str(draft)])
    assert exported.exit_code == 0, exported.output
    assert leaks(draft) == []
    assert f"https://user:***@{tag}.invalid/v1?api_key=***&n=1" in (draft / "recipe.yaml").read_text()
    assert f"mooncake://u:***@{tag}.invalid:50051/ns" in (draft / "dspark_manifest.json").read_text()

    dry = runner.invoke(app, ["publish", str(draft), "--repo-id", "me/tiny-draft", "--dry-run"])
    assert dry.exit_code == 0, dry.output
