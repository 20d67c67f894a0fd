"""Path rules: output directories no stage may write, and inputs an earlier stage must have made.

RULES are path arithmetic on the recipe alone (two stages sharing a directory, one stage's directory
holding another's); DISK_RULES look at what is on disk now (a directory another stage or something
else wrote, an unfinished input), with the rules `artifacts.files.claim_output_dir` applies.
"""

from __future__ import annotations

import os
from itertools import combinations
from pathlib import Path
from typing import TYPE_CHECKING

from dspark_cli.artifacts.draft import DRAFT_FILES
from dspark_cli.artifacts.files import MANIFEST_NAME, claim_output_dir, ownership_problem
from dspark_cli.errors import UsageError
from dspark_cli.preflight.stream import stream_is_ours
from dspark_cli.recipe.bounded import read_json

if TYPE_CHECKING:
    from dspark_cli.preflight import Context
    from dspark_cli.recipe.schema import Recipe

DIR_STAGES = ("datagen", "capture", "train", "export", "bench")  # the stages with an output_dir
KINDS = {"datagen": "dspark.datagen", "capture": "dspark.capture", "train": "dspark.train"}
SHARDS = {"datagen": "shard-*.jsonl", "capture": "shard-*.safetensors"}
DRAFT_MANIFEST = "dspark_manifest.json"


def _where(recipe: Recipe, stage: str) -> Path:
    return Path(os.path.normpath(os.path.abspath(os.path.expanduser(recipe.stage_dir(stage)))))


def output_dirs_creatable(recipe: Recipe) -> list[str]:
    """Each stage's output directory must be creatable: no file where it, or a directory above it, would be
    (a rule every stage shares: `shared.py` runs it)."""
    keys = [("output_dir", recipe.output_dir.replace("{name}", recipe.name))]
    keys += [(f"{stage}.output_dir", recipe.stage_dir(stage)) for stage in DIR_STAGES]
    problems, seen = [], set()
    for key, directory in keys:
        path = Path(directory).expanduser()
        blocker = next((p for p in (path, *path.parents) if p.exists() or p.is_symlink()), None)
        if blocker is None or blocker.is_dir() or blocker in seen:
            continue
        seen.add(blocker)
        problems.append(
            f"{key}: {directory} is a file, not a directory; choose another directory"
            if blocker == path
            else f"{key}: {blocker} is a file, so {directory} cannot be made; choose another directory"
        )
    return problems


def stage_dirs_apart(recipe: Recipe, context: Context) -> list[str]:
    """Each stage writes its own directory: none shared, none inside another stage's (export replaces its
    whole directory; a stage writing into its input's directory overwrites that input's manifest)."""
    problems = []
    for a, b in combinations(DIR_STAGES, 2):
        outer, inner = _where(recipe, a), _where(recipe, b)
        if outer == inner:
            problems.append(
                f"{b}.output_dir: {recipe.stage_dir(b)} is also {a}'s output directory; "
                f"give each stage its own (set {b}.output_dir)"
            )
            continue
        for (x, px), (y, py) in (((a, outer), (b, inner)), ((b, inner), (a, outer))):
            if px in py.parents:
                problems.append(
                    f"{x}.output_dir: {recipe.stage_dir(x)} holds {y}'s output directory "
                    f"{recipe.stage_dir(y)}; give each stage a directory of its own"
                )
    return problems


def export_output_claimable(recipe: Recipe, context: Context) -> list[str]:
    """What `export` refuses to write (claim_output_dir): not its own earlier draft, its input, the cwd."""
    source = context.options.inputs.get("export", recipe.stage_dir("train"))
    try:
        claim_output_dir(
            recipe.stage_dir("export"),
            kind="dspark.draft",
            what="draft",
            force=context.options.force,
            manifest_name=DRAFT_MANIFEST,
            inputs=(source,),
            own=DRAFT_FILES,
        )
    except UsageError as exc:
        return [f"export.output_dir: {exc.message}; {exc.hint}"]
    return []


def resumable_output_is_ours(recipe: Recipe, context: Context) -> list[str]:
    """datagen / capture / train continue in their directory: refused when another stage (or something
    else: a user's directory) wrote it (`ownership_problem`, what the stage itself refuses)."""
    problems = []
    for stage in context.stages:
        if stage in KINDS:
            problem = ownership_problem(recipe.stage_dir(stage), KINDS[stage], f"{stage}.output_dir", SHARDS.get(stage))
            problems += [problem] if problem else []
    return problems


def bench_output_is_ours(recipe: Recipe, context: Context) -> list[str]:
    """bench writes a new or empty folder, or its own earlier report of the same draft: refused when the
    folder holds anything bench did not write, or another draft's report (`artifacts.bench_output.output_problem`,
    what bench itself refuses). The draft is the one its command was given (`inputs["bench"]`, "" for a
    server alone), else the export's, as `dspark run` benches it."""
    from dspark_cli.artifacts.bench_output import output_problem

    draft = context.options.inputs.get("bench", recipe.stage_dir("export"))
    problem = output_problem(recipe.stage_dir("bench"), draft or None)
    return [problem] if problem else []


def capture_settings_match(recipe: Recipe, context: Context) -> list[str]:
    """A finished offline capture is trained on only with the capture settings that made it (training/run.py)."""
    if recipe.capture.mode != "offline":
        return []
    manifest = _manifest(Path(recipe.stage_dir("capture")))
    if manifest.get("kind") != KINDS["capture"] or not manifest.get("complete"):
        return []
    problems = []
    for key in ("max_seq_len", "shard_tokens"):
        made, now = manifest.get(key), getattr(recipe.capture, key)
        if made is not None and made != now:
            problems.append(
                f"capture.{key}: {recipe.stage_dir('capture')} was captured with capture.{key}={made}, "
                f"this recipe says {now}; set capture.{key}={made}, or capture into a new "
                "capture.output_dir"
            )
    return problems


def resume_never_has_nothing_to_overwrite(recipe: Recipe, context: Context) -> list[str]:
    if context.options.resume != "never":
        return []
    root = Path(recipe.stage_dir("train")).expanduser() / "checkpoints"
    done = sorted(p.name for p in root.glob("step-*") if (p / "meta.json").is_file() and (p / ".metadata").is_file())
    if done:
        return [
            f"--resume never: {recipe.stage_dir('train')} already holds checkpoints (latest {done[-1]}); "
            "continue with --resume auto, or train into another directory with -o DIR"
        ]
    return []


def inputs_ready(recipe: Recipe, context: Context) -> list[str]:
    """The input of the first stage run must exist already (a later stage's is made by the one before it)."""
    stages, problems = context.stages, []
    if "capture" in stages and "datagen" not in stages and not _complete(recipe, "capture"):
        if not _complete(recipe, "datagen"):
            problems.append(
                f"datagen.output_dir: {recipe.stage_dir('datagen')} holds no finished datagen output "
                "to capture from; run `dspark datagen RECIPE` first"
            )
    if "export" in stages and "train" not in stages:
        source = Path(context.options.inputs.get("export", recipe.stage_dir("train"))).expanduser()
        if not source.exists():
            problems.append(
                f"export: checkpoint not found: {source}; pass the training output directory (e.g. runs/NAME/train)"
            )
    return problems


def _complete(recipe: Recipe, stage: str) -> bool:
    manifest = _manifest(Path(recipe.stage_dir(stage)))
    return manifest.get("kind") == KINDS[stage] and bool(manifest.get("complete"))


def _manifest(directory: Path) -> dict:
    try:
        data = read_json(directory.expanduser() / MANIFEST_NAME)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def outputs_writable(recipe: Recipe, context: Context) -> list[str]:
    """Each stage's output directory can be made and written here (a read-only current directory, a
    read-only mount, no permission): what the stage would refuse once it starts writing."""
    problems = []
    for stage in context.stages:
        if stage not in DIR_STAGES:
            continue
        where = Path(os.path.abspath(os.path.expanduser(recipe.stage_dir(stage))))
        existing = where
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if existing.is_dir() and not os.access(existing, os.W_OK | os.X_OK):
            read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
            reason = "read-only file system" if read_only else "permission denied"
            problems.append(
                f"{stage}.output_dir: cannot write {where}: {reason} ({existing}); set output_dir "
                "(or -o) to a writable directory"
            )
    return problems


RULES = {stage: [stage_dirs_apart] for stage in DIR_STAGES}
DISK_RULES = {
    "datagen": [resumable_output_is_ours, outputs_writable],
    "capture": [resumable_output_is_ours, inputs_ready, outputs_writable],
    "train": [
        resumable_output_is_ours,
        stream_is_ours,
        capture_settings_match,
        resume_never_has_nothing_to_overwrite,
        outputs_writable,
    ],
    "export": [export_output_claimable, inputs_ready, outputs_writable],
    "bench": [bench_output_is_ours, outputs_writable],
}
