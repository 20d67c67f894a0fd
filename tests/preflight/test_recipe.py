"""The recipe schema, loader and cross-field checks."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dspark_cli.errors import RecipeError, UsageError
from dspark_cli.preflight.shared import shared_problems
from dspark_cli.recipe import Recipe, load_recipe, template_dir, template_names, write_resolved
from dspark_cli.recipe.schema import SECTIONS


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return path


def problems_of(recipe: str | Path | None, overrides: list[str] | None = None) -> list[str]:
    with pytest.raises(RecipeError) as info:
        load_recipe(recipe, overrides or [])
    return info.value.problems


def test_every_section_of_the_issue_exists():
    assert SECTIONS == ("target", "datagen", "capture", "draft", "train", "export", "serve", "bench", "publish")
    assert all(name in Recipe.model_fields for name in SECTIONS)


def test_every_field_is_documented_with_a_default():
    from dspark_cli.recipe.loader import _inner_model

    def walk(model, prefix):
        for name, field in model.model_fields.items():
            assert field.description, f"{prefix}{name} has no description"
            assert not field.is_required() or model.__name__ in ("PromptSource", "BenchDatasetSource"), (
                f"{prefix}{name} has no default"
            )
            inner = _inner_model(field.annotation)
            if inner is not None:
                walk(inner, f"{prefix}{name}.")

    walk(Recipe, "")


@pytest.mark.parametrize("name", ["kimi-k3", "qwen3-8b", "llama-3.1-8b", "tiny"])
def test_shipped_templates_validate(name):
    assert name in template_names()
    recipe = load_recipe(template_dir() / f"{name}.yaml")
    assert shared_problems(recipe) == []
    assert load_recipe(name) == recipe  # by name too (`llama-3.1-8b`: a dot is not a file suffix)


def test_template_headers_say_how_to_run_them():
    for path in template_dir().glob("*.yaml"):
        header = path.read_text().split("\n\n", 1)[0]
        assert header.startswith("#") and "dspark " in header, path.name


def test_kimi_k3_template_carries_the_published_numbers():
    recipe = load_recipe("kimi-k3")
    draft, serve = recipe.draft, recipe.serve
    assert (draft.arch, draft.num_layers, draft.block_size, draft.markov_rank) == ("mla", 5, 7, 256)
    assert draft.target_layer_ids == [2, 23, 47, 71, 89] and recipe.target.num_hidden_layers == 93
    assert draft.confidence_head and (draft.kv_lora_rank, draft.qk_rope_head_dim) == (512, 64)
    assert (recipe.datagen.temperature, recipe.datagen.top_p) == (1.0, 0.95)
    assert (serve.attention_backend, serve.draft_sample_method, serve.rejection_sample_method) == (
        "FLASHINFER_MLA",
        "probabilistic",
        "block",
    )
    sources = {s.path for s in recipe.datagen.sources}
    assert {"lightseekorg/kimi-mtp-dataset", "nvidia/OpenCodeInstruct", "CohereLabs/aya_dataset"} <= sources
    assert "mt_bench" in recipe.datagen.exclude_eval and recipe.train.epochs == 2.0


def test_precedence_defaults_yaml_overrides_flags(tmp_path):
    path = write(tmp_path, "train:\n  lr: 1.0e-3\n  warmup_steps: 7\n")
    assert load_recipe(None).train.lr == 6e-4  # default
    assert load_recipe(path).train.lr == 1e-3  # yaml beats default
    assert load_recipe(path, ["train.lr=3e-4"]).train.lr == 3e-4  # override beats yaml
    flagged = load_recipe(path, ["train.lr=3e-4"], {"train.lr": 5e-5, "train.warmup_steps": None})
    assert flagged.train.lr == 5e-5  # flag beats override
    assert flagged.train.warmup_steps == 7  # an unset flag (None) changes nothing


def test_override_values_are_yaml():
    recipe = load_recipe(
        None, ["draft.target_layer_ids=[1, 2, 3]", "draft.confidence_head=false", "train.max_steps=null"]
    )
    assert recipe.draft.target_layer_ids == [1, 2, 3]
    assert recipe.draft.confidence_head is False and recipe.train.max_steps is None


def test_unknown_section_and_key_suggest_the_closest(tmp_path):
    assert problems_of(write(tmp_path, "trian:\n  lr: 1\n")) == ["trian: unknown section (did you mean 'train'?)"]
    assert problems_of(None, ["train.lrr=1"]) == ["train.lrr: unknown key (did you mean 'train.lr'?)"]
    [line] = problems_of(None, ["datagen.sources=[{path: a.jsonl, formt: messages}]"])
    assert line == "datagen.sources[0].formt: unknown key (did you mean 'datagen.sources[0].format'?)"


def test_wrong_types_and_ranges_name_the_path(tmp_path):
    assert problems_of(None, ["draft.block_size=0"]) == ["draft.block_size: must be greater than 0 (got 0)"]
    assert problems_of(None, ["train.lr=fast"]) == ["train.lr: expected a number, got 'fast' (str)"]
    assert problems_of(write(tmp_path, "draft:\n  num_layers: '2'\n")) == [
        "draft.num_layers: expected an integer, got '2' (str)"
    ]
    assert problems_of(None, ["draft.confidence_head=maybe"]) == [
        "draft.confidence_head: expected true or false, got 'maybe' (str)"
    ]


def test_every_problem_is_reported_at_once(tmp_path):
    path = write(tmp_path, "trian: {}\ntrain:\n  lrr: 1\n  lr: x\ndraft:\n  block_size: -1\n")
    problems = problems_of(path)
    assert len(problems) == 4, problems
    assert {p.split(":")[0] for p in problems} == {"trian", "train.lrr", "train.lr", "draft.block_size"}


def test_bad_yaml_and_missing_files_are_one_line(tmp_path):
    with pytest.raises(UsageError, match=r"recipe.yaml:\d+: invalid YAML"):
        load_recipe(write(tmp_path, "train:\n  lr: [1\n"))
    with pytest.raises(UsageError, match="recipe not found: nope.yaml"):
        load_recipe("nope.yaml")
    with pytest.raises(UsageError, match="did you mean the template 'tiny'"):
        load_recipe("tinyy")
    with pytest.raises(RecipeError, match="a recipe is a mapping"):
        load_recipe(write(tmp_path, "- 1\n- 2\n"))
    with pytest.raises(RecipeError, match="overrides look like section.key=value"):
        load_recipe(None, ["train.lr"])


def test_cross_field_checks(tmp_path):
    recipe = load_recipe(
        "tiny",
        [
            "draft.target_layer_ids=[0, 1, 99]",
            "serve.num_speculative_tokens=5",
            "draft.num_key_value_heads=2",
            "train.nnodes=2",
            "draft.mask_token_id=10000000",
            "draft.confidence_head=false",
            "train.loss.slot_weighting=expected_length",
        ],
    )
    problems = shared_problems(recipe)
    joined = "\n".join(problems)
    assert "draft.target_layer_ids: layer 99 is beyond the target's" in joined
    assert "serve.num_speculative_tokens: 5 differs from draft.block_size 7" in joined
    assert "draft.num_key_value_heads: only for gqa drafts, this one is mla" in joined
    assert "train.rdzv_endpoint: required when train.nnodes > 1" in joined
    assert "draft.mask_token_id: 10000000 is outside the target vocabulary" in joined
    assert "train.loss.slot_weighting: expected_length reads the confidence head's estimates" in joined
    assert len(problems) == 6


def test_unresolvable_target_is_a_problem():
    problems = shared_problems(load_recipe("tiny", ["target.model=tiny-mlaa"]))
    assert len(problems) == 1 and problems[0].startswith("target.model:") and "tiny-mla" in problems[0]


def test_resolved_recipe_round_trips(tmp_path):
    recipe = load_recipe("tiny", ["train.lr=3e-4"])
    path = write_resolved(recipe, tmp_path / "out")
    assert path.name == "recipe.yaml" and not list((tmp_path / "out").glob(".recipe.*"))
    (tmp_path / "plain").touch()  # the mode open() gives under this umask: readable by the cluster's other users
    assert path.stat().st_mode == (tmp_path / "plain").stat().st_mode
    again = load_recipe(path)
    assert again == recipe
    assert yaml.safe_load(path.read_text())["train"]["lr"] == 3e-4


def test_stage_dirs_follow_the_name():
    recipe = load_recipe("tiny", ["train.output_dir=/tmp/x"])
    assert recipe.stage_dir("datagen") == "runs/tiny/data"
    assert recipe.stage_dir("train") == "/tmp/x"
