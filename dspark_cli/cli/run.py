"""`dspark run RECIPE`: every stage in order (datagen, capture, train, export, bench, and publish)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from dspark_cli.cli.common import OverridesArg, RecipeArg, load, preflight_stage
from dspark_cli.ui import handle_errors, print_table, say


@handle_errors
def run(
    recipe: RecipeArg,
    overrides: OverridesArg = None,
    publish: Annotated[bool, typer.Option(
        "--publish", help="Also publish at the end (repo and tokens are checked before the first stage).")] = False,
) -> None:
    """Run the whole pipeline from one recipe: datagen, capture, train, export, bench (and publish)."""
    from dspark_cli.errors import NotBuiltError
    from dspark_cli.pipeline import STAGES, run_pipeline

    loaded = load(recipe, overrides)
    preflight_stage(loaded, ["datagen", "capture", "train", "export", "bench"] + ["publish"] * publish, recipe, force=True)
    if publish:  # a destination and tokens now, not after hours of training
        from dspark_cli.publish import preflight

        preflight(loaded)
    say(f"dspark run: {loaded.name} on target {loaded.target.model}")
    wanted = [s.name for s in STAGES if s.name != "publish" or publish]
    from dspark_cli.ui import progress_bar

    results = run_pipeline(loaded, stages=wanted, on_stage=lambda r: say(f"  {r.name}: {r.status} {r.detail}".rstrip()),
                           progress=lambda stage, unit: progress_bar(f"  {stage}", unit=unit),
                           log_line=lambda line: say(f"  train: {line}"))
    print_table("stages", ["stage", "status", "detail"], [[r.name, r.status, r.detail] for r in results])
    _say_results({r.name: r.outputs for r in results if r.status == "done"})
    missing = [r.name for r in results if r.status == "not built"]
    if missing:
        raise NotBuiltError(
            f"pipeline incomplete: stage {missing[0]} is not built yet; later stages were skipped",
            "the stages marked done ran for real",
        )


def _say_results(outputs: dict[str, Any]) -> None:
    """The few numbers a finished run is for: where the draft is and its acceptance length."""
    if "export" in outputs:
        say(f"draft: {outputs['export']['output_dir']} ({outputs['export']['architecture']})")
    bench_result = outputs.get("bench") or {}
    for run_ in (bench_result.get("offline") or {}).get("runs", []):
        if run_.get("threshold", 0.0) == 0.0:
            low, high = run_["tau"]["ci95"]
            say(f"tau on {run_['dataset']} at T={run_['temperature']:g}: {run_['tau']['mean']:.2f} "
                f"[{low:.2f}, {high:.2f}] tokens per verification step", style="green")
    if bench_result.get("files"):
        say(f"report: {bench_result['files']['markdown']}")
