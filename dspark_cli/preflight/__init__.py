"""Preflight: everything a stage would refuse, or could not do, judged before any work.

    from dspark_cli.preflight import preflight, check_preflight
    preflight(recipe, ["datagen", "capture", "train"])          # [] or one line per problem
    preflight(recipe, ["train"], machine=False)                  # the recipe alone (a cluster recipe on a laptop)
    check_preflight(recipe, ["export"], StageOptions(force=True))  # RecipeError (exit 2) listing them all

`dspark validate`, every stage command and `dspark run` (for every stage it will run, before the
first starts) call this one function, so a stage never fails late on something visible up front.
Four kinds of rule, each a small function returning problem lines ("key: what is wrong; the fix"):

- shared rules (`shared.py`), first: what every stage refuses (the target and its files, the draft's
  family and layer ids, fields that contradict each other, output directories that cannot be made);
- recipe rules (`rules.py`): what one stage refuses from the recipe alone (e.g. an export format the
  draft cannot take);
- machine rules (`host.py`): this machine's GPUs, the engines and packages installed, the files the
  recipe names, hub tokens (skipped with `machine=False`: `dspark validate --recipe-only`);
- path rules (`paths.py`): output directories no stage may write (another stage's, or its own input)
  and inputs an earlier stage must have made (unless that stage runs too).

Import-light: no torch, and no CUDA started (GPUs are counted from device nodes: `Machine.gpus`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dspark_cli.machine.facts import Machine

if TYPE_CHECKING:
    from dspark_cli.recipe.schema import Recipe

__all__ = ["ALL_STAGES", "RUN_STAGES", "Context", "Machine", "StageOptions", "check_preflight", "preflight"]

ALL_STAGES = ("datagen", "capture", "train", "export", "bench", "serve", "publish")
RUN_STAGES = ("datagen", "capture", "train", "export", "bench")  # what `dspark run` runs (publish with --publish)


@dataclass(frozen=True)
class StageOptions:
    """What a stage command's flags change about its refusals (the defaults are `dspark run`'s)."""

    force: bool = False  # export --force: an earlier draft may be replaced (`dspark run` always replaces it)
    resume: str = "auto"  # train --resume
    serve_method: str = "dspark"  # serve --method
    dry_run: bool = False  # serve / publish --dry-run: no GPU, no vLLM, no token needed
    inputs: dict[str, str] = field(default_factory=dict)  # stage -> the input directory its command was given


@dataclass(frozen=True)
class Context:
    stages: tuple[str, ...]
    options: StageOptions
    machine: Machine | None  # None: recipe-only


def preflight(
    recipe: Recipe,
    stages: list[str] | tuple[str, ...] = RUN_STAGES,
    options: StageOptions | None = None,
    *,
    machine: Machine | bool = True,
    shared: bool = True,
) -> list[str]:
    """Every problem `stages` of `recipe` would meet, one line each (empty: nothing to refuse).

    `machine=True` judges this machine, `False` the recipe alone, a `Machine(...)` the machine it describes.
    `shared=False` leaves out the shared rules (`shared.py`): the commands run those once, as they load the
    recipe (`cli/common.load`), so a command never runs a rule twice."""
    from dspark_cli.preflight import host, paths, rules
    from dspark_cli.preflight.shared import shared_problems

    unknown = [s for s in stages if s not in ALL_STAGES]
    if unknown:
        from dspark_cli.errors import UsageError

        raise UsageError(f"unknown stage {unknown[0]!r}", f"stages: {', '.join(ALL_STAGES)}")
    chosen = tuple(s for s in ALL_STAGES if s in stages)
    facts = Machine() if machine is True else (machine or None)
    context = Context(chosen, options or StageOptions(), facts)
    problems = shared_problems(recipe) if shared else []
    groups = [rules.RULES, paths.RULES] + ([host.RULES, paths.DISK_RULES] if facts is not None else [])
    for stage in chosen:
        for group in groups:
            for rule in group.get(stage, ()):
                problems += [p for p in rule(recipe, context) if p not in problems]
    return problems


def check_preflight(
    recipe: Recipe,
    stages: list[str] | tuple[str, ...] = RUN_STAGES,
    options: StageOptions | None = None,
    *,
    machine: Machine | bool = True,
    shared: bool = True,
    source: str | None = None,
) -> None:
    """`preflight`, as one RecipeError (exit 2) listing every problem; `source` names the recipe in the hint."""
    problems = preflight(recipe, stages, options, machine=machine, shared=shared)
    if problems:
        from dspark_cli.errors import RecipeError

        raise RecipeError(problems, f"fix {source or 'the recipe'} (or this machine) and run `dspark validate` again")
