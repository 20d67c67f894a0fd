"""Every record in benchmarks/results/: the script that writes it, the command that regenerates it, and the
source paths (files or folders) whose change invalidates it.

A record is `results/NAME.json` with the `.md` its script renders from it (and, for some, other files listed
in `extra`); `results/NAME.notes.md` holds what people wrote about it (the scripts never write those). The
writer (provenance.py) refuses a name that is not here, and tests/benchmarks/test_records.py fails when a
dependency has changed since the record's commit. The script itself is always a dependency. Keep `depends`
as narrow as the numbers honestly are: a folder where the record runs most of it, files where it runs a few.
"""

from __future__ import annotations

from dataclasses import dataclass

PY = ".venv/bin/python"
TINY = "templates/recipes/tiny.yaml"

# What the CLI imports to print its help: the commands, the console helpers and every package face.
CLI_FACES = (
    "dspark_cli/__init__.py",
    "dspark_cli/cli/",
    "dspark_cli/ui.py",
    "dspark_cli/lazy.py",
    "dspark_cli/errors.py",
    "dspark_cli/hubrules.py",
    "dspark_cli/artifacts/__init__.py",
    "dspark_cli/artifacts/results.py",
    "dspark_cli/bench/__init__.py",
    "dspark_cli/capture/__init__.py",
    "dspark_cli/datagen/__init__.py",
    "dspark_cli/draft/__init__.py",
    "dspark_cli/export/__init__.py",
    "dspark_cli/kernels/__init__.py",
    "dspark_cli/machine/__init__.py",
    "dspark_cli/preflight/__init__.py",
    "dspark_cli/prompts/__init__.py",
    "dspark_cli/publish/__init__.py",
    "dspark_cli/recipe/__init__.py",
    "dspark_cli/serving/__init__.py",
    "dspark_cli/targets/__init__.py",
    "dspark_cli/training/__init__.py",
)
# A recipe loaded and a bundled tiny target read: what every stage below starts from.
RECIPE = ("dspark_cli/recipe/", "dspark_cli/targets/", "dspark_cli/contract.py", TINY)
DATAGEN = (*RECIPE, "dspark_cli/datagen/", "dspark_cli/prompts/", "dspark_cli/artifacts/", "dspark_cli/machine/")
# The Mooncake store's client code runs only for a `mooncake://` stream (capture/store.py imports it there,
# and nothing else does); no record's command opens one, so a change to it moves no number here. A git
# `:(exclude)` pathspec takes it out of a folder listed above.
MOONCAKE_ONLY = (":(exclude)dspark_cli/capture/mooncake_store.py", ":(exclude)dspark_cli/capture/mooncake_location.py")
CAPTURE = (*DATAGEN, "dspark_cli/capture/", *MOONCAKE_ONLY)
MODEL = ("dspark_cli/draft/", "dspark_cli/kernels/")
TRAIN = (*RECIPE, *MODEL, "dspark_cli/training/", "dspark_cli/machine/", "dspark_cli/capture/types.py")
# `dspark run`: every stage up to bench (serving, publish and the commands' own code do not move a number).
PIPELINE = (
    *CAPTURE,
    *MODEL,
    "dspark_cli/training/",
    "dspark_cli/export/",
    "dspark_cli/bench/",
    "dspark_cli/pipeline.py",
)


@dataclass(frozen=True)
class Record:
    script: str  # the committed script that writes it
    command: str  # the command that regenerates it
    depends: tuple[str, ...]  # paths (a trailing / for a folder) whose change invalidates it
    extra: tuple[str, ...] = ()  # files of the record besides NAME.json and NAME.md, as suffixes
    device: bool = False  # made on a lent GPU machine: absent until one is lent (once there, it is checked)


RECORDS: dict[str, Record] = {
    "cli_startup": Record("benchmarks/cli_startup.py", f"{PY} benchmarks/cli_startup.py", CLI_FACES),
    "datagen_speed": Record(
        "benchmarks/datagen_speed.py",
        f"{PY} benchmarks/datagen_speed.py && {PY} benchmarks/datagen_speed.py --target tiny-gqa",
        DATAGEN,
    ),
    "capture_backends": Record("benchmarks/capture_backends.py", f"{PY} benchmarks/capture_backends.py", CAPTURE),
    "draft_model": Record("benchmarks/draft_model.py", f"{PY} benchmarks/draft_model.py", MODEL),
    "train_speed": Record("benchmarks/train_speed.py", f"{PY} benchmarks/train_speed.py", TRAIN),
    "train_tau": Record(
        "benchmarks/train_tau.py",
        f"{PY} benchmarks/train_tau.py --prompts 400 --steps 200",
        (*CAPTURE, *MODEL, "dspark_cli/training/", "dspark_cli/bench/engine.py", "dspark_cli/bench/verify.py"),
    ),
    "demo_tau": Record(
        "benchmarks/demo_tau.py",
        f"{PY} benchmarks/demo_tau.py demo final && {PY} benchmarks/demo_tau.py rebench demo-final --t1",
        PIPELINE,
    ),
    "warm_start": Record(
        "benchmarks/warm_start.py",
        f"{PY} benchmarks/warm_start.py",
        (
            *PIPELINE,
            "benchmarks/demo_tau.py",  # its `_timed`
            "dspark_cli/prompts/bundled/tiny-prompts.jsonl",
            "dspark_cli/prompts/bundled/tiny-eval.jsonl",
        ),
    ),
    "sweep": Record(
        "benchmarks/sweep.py",
        f"{PY} benchmarks/sweep.py",
        (*PIPELINE, "benchmarks/demo_tau.py"),  # demo_tau: its `_timed`
    ),
    "bench_batched": Record(
        "benchmarks/bench_batched.py",
        f"{PY} benchmarks/bench_batched.py",
        (*PIPELINE, "benchmarks/demo_tau.py"),
    ),
    # The all-peers comparison, one record per fresh seed (seeds no setting was chosen on: sweep.py selects on 0).
    **{
        f"peers-all-seed{seed}": Record(
            "benchmarks/peers/run.py",
            f"{PY} benchmarks/peers/run.py --peers specforge,speculators,nemo_automodel --seed {seed} --repeats 1 --no-same-time",
            (*PIPELINE, "benchmarks/peers/"),
        )
        for seed in (11, 12, 13)
    },
    # benchmarks/objective.py's, benchmarks/bench_engine.py's and benchmarks/capture.py's records (objective*,
    # settings*, warmup-*, bench_engine, capture) and the SpecForge-only peers.* are retired until rerun:
    # benchmarks/README.md, "Retired records", lists each with its command and commit.
    "serve_cpu_memory": Record(
        "benchmarks/serve_cpu_memory.sh",
        "bash benchmarks/serve_cpu_memory.sh",
        (*RECIPE, "dspark_cli/serving/", "dspark_cli/machine/procs.py", "dspark_cli/cli/serve.py"),
    ),
    "gpu_rehearsal": Record(
        "benchmarks/gpu/rehearse.sh",
        "bash benchmarks/gpu/rehearse.sh",
        (
            *PIPELINE,
            "benchmarks/gpu/",
            "tests/training/test_train_gpu_path.py",
            "tests/draft/test_draft_numerics.py",
            "tests/training/test_train_runs.py",
        ),
    ),
    **{
        name: Record(
            "benchmarks/gpu/run.sh",
            "(device) bash benchmarks/gpu/run.sh --sections " + sections + " --time-limit 540",
            (*PIPELINE, "benchmarks/gpu/"),
            extra=(".log",),
            device=True,
        )
        for name, sections in (("gpu_check", "throughput,numerics"), ("gpu_check-2", "pipeline,fsdp"))
    },
    "suite_time": Record(
        "benchmarks/suite_time.py",
        f"{PY} benchmarks/suite_time.py --commits HEAD",
        # The harness, not every test: the suite's time moves a little with each test added, and README quotes
        # it as of the record's commit; a new set-up, shared fixture or test-command step is what it measures.
        ("scripts/", ".ci/", "pyproject.toml", "tests/conftest.py", "tests/skips_allowed.txt"),
    ),
}


def record(name: str) -> Record:
    """The table's entry for `name`; a name that is not in the table is refused with the fix."""
    if name not in RECORDS:
        raise SystemExit(f"benchmarks/records.py has no record {name!r}: add it (its script, command and sources)")
    return RECORDS[name]


def depends(name: str) -> tuple[str, ...]:
    """What invalidates record `name`: its sources and its own script."""
    entry = record(name)
    return tuple(dict.fromkeys((*entry.depends, entry.script)))
