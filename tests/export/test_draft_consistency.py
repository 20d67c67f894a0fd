"""A draft's config.json and its dspark_manifest.json cannot contradict each other.

    .venv/bin/python -m pytest tests/export/test_draft_consistency.py -q

config.json is what vLLM loads, so it is the source of truth: the block size (`block_size_of`, read as
vLLM 0.33 reads it), the target layer ids, the mask token, the architecture, the dtype and the format.
The manifest repeats them (for `dspark serve`, the model card, people); a draft whose copies disagree
was edited after export and is refused by `export --check`, `bench` and `serve`, with one line naming
both values and both files. The drafts are exported by `dspark export` from random tiny-gqa drafts
(block size 4, the tiny recipe's default being 7) and then edited as a forger would: the checksums
in the manifest are recomputed after every edit, so only the contradiction is left to find.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from bench_support import export_random_draft
from cli_support import assert_user_error, invoke

from dspark_cli.recipe import load_recipe

pytestmark = pytest.mark.usefixtures("one_thread")

BLOCK = 4


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """One exported tiny-gqa draft of block size 4 (bench settings small enough for a one-turn run)."""
    work = tmp_path_factory.mktemp("consistency")
    recipe = load_recipe(
        "tiny",
        [
            "target.model=tiny-gqa",
            "draft.arch=gqa",
            f"draft.block_size={BLOCK}",
            f"output_dir={work / 'run'}",
            "bench.datasets=[mt_bench]",
            "bench.num_prompts=1",
            "bench.max_tokens=4",
            "bench.temperatures=[0.0]",
            "bench.confidence_thresholds=[0.0]",
            "bench.baselines=[]",
        ],
    )
    return export_random_draft(recipe, work / "draft")


@pytest.fixture
def draft(exported, tmp_path) -> Path:
    """A copy of the exported draft this test may edit."""
    return Path(shutil.copytree(exported, tmp_path / "draft"))


def edit(draft: Path, name: str, change) -> None:
    """Edit one JSON file of the draft, then record every file's checksum again, as a forger would."""
    path = draft / name
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=2))
    manifest = json.loads((draft / "dspark_manifest.json").read_text())
    manifest["files"] = {n: hashlib.sha256((draft / n).read_bytes()).hexdigest() for n in manifest["files"]}
    (draft / "dspark_manifest.json").write_text(json.dumps(manifest))


def check_lines(draft: Path) -> list[str]:
    """`dspark export --check DRAFT`: its error lines (it must fail)."""
    result = invoke("export", "--check", str(draft))
    assert result.exit_code == 1, result.output
    return [line for line in result.output.splitlines() if line.startswith("error: ")]


def test_the_exported_draft_passes(exported):
    result = invoke("export", "--check", str(exported))
    assert result.exit_code == 0 and "error" not in result.output, result.output


BLOCK_LINE = (
    "block_size: config.json says 64, dspark_manifest.json (serving.num_speculative_tokens) says 4; "
    "fix: export the draft again"
)


def test_a_block_size_edited_in_config_json_is_refused_by_check_bench_and_serve(draft):
    edit(draft, "config.json", lambda c: c.update(block_size=64))
    assert any(line.startswith(f"error: {BLOCK_LINE}") for line in check_lines(draft)), check_lines(draft)
    # bench refuses before any target is loaded or anything measured; serve before a command is printed
    bench = invoke("bench", str(draft), "--offline")
    assert_user_error(bench, BLOCK_LINE, "not benchmarking it", exit_code=1)
    serve = invoke("serve", str(draft), "--dry-run")
    assert_user_error(serve, BLOCK_LINE, "not serving it", exit_code=1)


@pytest.mark.parametrize(
    ("place", "value", "line"),
    [
        (
            ("contract", "block_size"),
            7,
            "block_size: config.json says 4, dspark_manifest.json (contract.block_size) says 7",
        ),
        (
            ("contract", "target_layer_ids"),
            [0, 1, 2, 3, 5],
            "target_layer_ids: config.json says [0, 1, 2, 4, 5], dspark_manifest.json (contract.target_layer_ids) "
            "says [0, 1, 2, 3, 5]",
        ),
        (
            ("contract", "mask_token_id"),
            6,
            "mask_token_id: config.json says 5, dspark_manifest.json (contract.mask_token_id) says 6",
        ),
        (
            (None, "architecture"),
            "K3DSparkModel",
            "architectures: config.json says 'Qwen3DSparkModel', dspark_manifest.json (architecture) says "
            "'K3DSparkModel'",
        ),
        ((None, "dtype"), "bfloat16", "torch_dtype: config.json says 'float32', dspark_manifest.json (dtype)"),
        ((None, "format"), "speculators", "format: config.json says 'vllm', dspark_manifest.json (format)"),
    ],
)
def test_every_copy_in_the_manifest_must_agree_with_config_json(draft, place, value, line):
    section, key = place

    def change(manifest):
        (manifest[section] if section else manifest)[key] = value

    edit(draft, "dspark_manifest.json", change)
    assert any(found.startswith(f"error: {line}") for found in check_lines(draft)), check_lines(draft)


def test_a_speculators_config_cannot_draft_two_block_sizes(exported, tmp_path):
    """speculators format: `speculative_tokens` (vLLM's default when the draft is launched as the model)
    and `block_size` (what the draft config says) are one number."""
    from dspark_cli.export.writer import export_draft

    out = tmp_path / "spec"
    export_draft(exported.parent / "draft-train", out, dtype="float32", fmt="speculators", target="tiny-gqa")
    assert invoke("export", "--check", str(out)).exit_code == 0
    edit(out, "config.json", lambda c: c["speculators_config"]["proposal_methods"][0].update(speculative_tokens=64))
    lines = check_lines(out)
    assert any("speculative_tokens 64 != block_size 4" in line for line in lines), lines


def test_dspark_block_size_is_read_as_vllm_reads_it(draft):
    """vLLM takes `block_size`, else `dspark_block_size`: so do bench's loader and serve."""
    from dspark_cli.artifacts.draft import load_draft_dir

    def rename(config):
        config["dspark_block_size"] = config.pop("block_size")

    edit(draft, "config.json", rename)
    assert invoke("export", "--check", str(draft)).exit_code == 0
    assert load_draft_dir(draft).config.block_size == BLOCK  # what bench drafts with
    from dspark_cli.artifacts.draft import draft_block_size

    assert draft_block_size(draft) == BLOCK  # what serve passes to vLLM
    serve = invoke("serve", str(draft), "--dry-run")
    assert serve.exit_code == 0 and f'"num_speculative_tokens": {BLOCK}' in serve.output, serve.output
    edit(draft, "config.json", lambda c: c.update(block_size=BLOCK + 1))  # both set, and they disagree
    lines = check_lines(draft)
    assert any(f"dspark_block_size: {BLOCK} disagrees with block_size {BLOCK + 1}" in line for line in lines), lines


def test_serve_cannot_draft_more_tokens_than_the_draft_was_trained_for(exported):
    """A recipe that asks for more tokens than the draft was trained with (bench refuses it too)."""
    more = f"serve.num_speculative_tokens={BLOCK + 1}"
    args = ("--recipe", "tiny", "target.model=tiny-gqa", "draft.arch=gqa", f"draft.block_size={BLOCK + 1}", more)
    result = invoke("serve", str(exported), "--dry-run", *args)
    assert_user_error(result, f"{more} exceeds the draft's block size {BLOCK}")


def test_export_refuses_a_checkpoint_whose_config_contradicts_its_training_contract(exported, tmp_path):
    """The contract comes from training's manifest.json, config.json from the checkpoint: export would
    otherwise write a draft every later stage refuses."""
    train = Path(shutil.copytree(exported.parent / "draft-train", tmp_path / "train"))
    config = json.loads((train / "final" / "config.json").read_text())
    (train / "final" / "config.json").write_text(json.dumps({**config, "block_size": 64}))
    result = invoke("export", str(train), "-o", str(tmp_path / "out"))
    assert_user_error(
        result,
        "block_size: config.json says 64, the training run's manifest.json (contract.block_size) says 4",
        exit_code=1,
    )
    assert not (tmp_path / "out").exists()
