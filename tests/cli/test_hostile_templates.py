"""Hostile chat templates: a target whose template loops for ever, asks for a huge range, prints megabytes,
does not parse or refuses every conversation (raise_exception) ends `dspark datagen` and `dspark bench` in
one `error:` line naming the template's file, and one `hint:` line; within DSPARK_CHAT_TEMPLATE_SECONDS
(set to 0.5 s here) plus start-up; with nothing written and the target untouched.

    .venv/bin/python -m pytest tests/cli/test_hostile_templates.py -q
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

import pytest
from cli_support import assert_user_error, invoke, invoke_process

from dspark_cli.targets.chat import SECONDS_ENV

SECONDS = 0.5
# 1e4 x 1e5 empty iterations: ~70 s unbounded, so a bound that stops working fails this suite, not hangs it
LONG_LOOP = (
    "{% for m in messages %}{{ m['content'] }}{% endfor %}\n"
    "{% for i in range(10000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
)
NEVER_ENDS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"  # 1e10: hours
CASES = {
    # name: (template, what the error line says besides the template's file)
    "nested_loop": (LONG_LOOP, ["took over 0.5 s", "stopped at line 2"]),
    "huge_range": (
        "{% for i in range(10000000000) %}x{% endfor %}",
        ["failed on a conversation", "line 1: OverflowError: Range too big"],
    ),
    "huge_output": (  # 1 MB a message
        "{% for m in messages %}{% for i in range(1000) %}{{ 'x' * 1000 }}{% endfor %}{{ m['content'] }}{% endfor %}",
        ["printed 1,000,010 characters for a conversation of 10 (at most 65,556)"],
    ),
    "syntax_error": (
        "{% for m in messages %}{{ m['content'] }}{% endfor %",
        ["does not parse (line 1: expected token"],
    ),
    "raise_exception": (
        "{{ raise_exception('this template refuses everything') }}",
        ["line 1: TemplateError: this template refuses everything"],
    ),
}


@pytest.fixture(scope="module", autouse=True)
def _imported():
    """transformers and the datagen modules imported once, so that a run's time is its own (~1 s)."""
    from transformers import AutoTokenizer

    from dspark_cli.datagen.run import plan_datagen  # noqa: F401
    from dspark_cli.targets import resolve_target

    AutoTokenizer.from_pretrained(str(resolve_target("tiny-mla")))


def hostile_target(tmp_path: Path, template: str, *, in_config: bool = False) -> tuple[Path, str]:
    """A copy of the bundled tiny-mla whose chat template is `template`, in chat_template.jinja or in
    tokenizer_config.json -> (its directory, the template's file as the error line names it)."""
    from dspark_cli.targets import resolve_target

    target = tmp_path / "target"
    shutil.copytree(resolve_target("tiny-mla"), target)
    config = json.loads((target / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    if in_config:
        (target / "chat_template.jinja").unlink()
        config["chat_template"] = template
        origin = f"{target / 'tokenizer_config.json'} (chat_template)"
    else:
        (target / "chat_template.jinja").write_text(template)
        origin = str(target / "chat_template.jinja")
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    return target, origin


def files_of(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.rglob("*")}


def datagen_args(tmp_path: Path, target: Path | str, *extra: str) -> list[str]:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"id": i, "messages": [{"role": "user", "content": f"question {i}"}]}) + "\n" for i in range(3)
        )
    )
    return [
        "datagen",
        "tiny",
        f"target.model={target}",
        f"output_dir={tmp_path / 'run'}",
        f"datagen.sources=[{{path: {prompts}}}]",
        "datagen.regenerate=false",
        "datagen.exclude_eval=[]",
        *extra,
    ]


@pytest.mark.parametrize("case", list(CASES))
def test_datagen_dry_run_ends_in_one_line_naming_the_template(tmp_path, monkeypatch, case):
    monkeypatch.setenv(SECONDS_ENV, str(SECONDS))
    template, needles = CASES[case]
    target, origin = hostile_target(tmp_path, template, in_config=case == "nested_loop")
    before = files_of(target)
    started = time.perf_counter()
    result = invoke(*datagen_args(tmp_path, target), "--dry-run")
    elapsed = time.perf_counter() - started
    assert_user_error(result, f"the chat template {origin} ", *needles)
    assert elapsed < SECONDS + 3, elapsed  # the recipe and tokenizer load in ~0.5 s; the loop runs ~70 s
    assert not (tmp_path / "run").exists() and files_of(target) == before


def test_a_template_that_never_ends_stops_a_datagen_run(tmp_path, monkeypatch):
    """The reported hang: a 1e5 x 1e5 loop, in a `dspark` process of its own (killed at 60 s if it hangs)."""
    monkeypatch.setenv(SECONDS_ENV, str(SECONDS))
    target, origin = hostile_target(tmp_path, NEVER_ENDS)
    result = invoke_process(*datagen_args(tmp_path, target), timeout=60)
    assert_user_error(result, f"the chat template {origin} took over 0.5 s", "(stopped at line 1)")
    assert not (tmp_path / "run").exists()


def test_a_runaway_template_is_refused_before_bench_loads_the_target(tmp_path, monkeypatch):
    from bench_support import export_random_draft

    from dspark_cli.recipe import load_recipe

    recipe = load_recipe("tiny", ["target.model=tiny-mla", "draft.arch=mla", f"output_dir={tmp_path / 'draft-run'}"])
    draft = export_random_draft(recipe, tmp_path / "draft")
    monkeypatch.setenv(SECONDS_ENV, str(SECONDS))
    target, origin = hostile_target(tmp_path, NEVER_ENDS)
    result = invoke(
        "bench",
        str(draft),
        "--offline",
        f"target.model={target}",
        f"output_dir={tmp_path / 'run'}",
        "bench.datasets=[mt_bench]",
        "bench.num_prompts=1",
    )
    # one line: no "Loading weights" bar before it, the template was tried first
    assert_user_error(result, f"the chat template {origin} took over 0.5 s")
    assert not [p for p in (tmp_path / "run").rglob("*") if p.is_file()]


@pytest.mark.parametrize(
    ("name", "value"),
    [(SECONDS_ENV, "soon"), (SECONDS_ENV, "0"), (SECONDS_ENV, "nan"), ("DSPARK_CHAT_TEMPLATE_MAX_CHARS", "1e6")],
)
def test_a_bound_that_is_not_a_number_is_refused(tmp_path, monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    result = invoke(*datagen_args(tmp_path, "tiny-mla"), "--dry-run")
    assert_user_error(result, f"{name}={value!r}")
    assert not (tmp_path / "run").exists()


def test_a_larger_bound_lets_a_verbose_template_through(tmp_path, monkeypatch):
    """The bounds are settings, not verdicts: 100 kB a message is refused by default, rendered with room."""
    target, origin = hostile_target(tmp_path, "{% for m in messages %}{{ 'x' * 100000 }}{{ m['content'] }}{% endfor %}")
    args = [*datagen_args(tmp_path, target, "datagen.max_prompt_tokens=200000"), "--dry-run"]
    assert_user_error(invoke(*args), f"the chat template {origin} printed 100,010 characters")
    monkeypatch.setenv("DSPARK_CHAT_TEMPLATE_MAX_CHARS", "200000")
    result = invoke(*args)
    assert result.exit_code == 0 and "conversations" in result.output, result.output
