"""The model card (README.md) a published draft carries: what it is, how to serve it, what it measured.

    text = model_card(draft_dir, manifest, repo_id="my-org/Qwen3-8B-DSpark", recipe=recipe,
                      license_id="apache-2.0", bench=bench_json)

Everything on the card comes from files dspark wrote: the draft's `dspark_manifest.json` (contract,
serving settings, training summary), its `config.json` (architecture) and, when the recipe's bench
stage measured this very draft, `bench.json` (tau with confidence intervals). The serving command is
built by the same code as `dspark serve`, with the draft referenced by its repo id.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dspark_cli import __version__
from dspark_cli.recipe.bounded import read_json

if TYPE_CHECKING:
    from dspark_cli.artifacts.bench import BenchSummary, Estimate
    from dspark_cli.recipe.schema import Recipe


def _front_matter(license_id: str, base_model: str | None) -> list[str]:
    lines = ["---", f"license: {license_id}", "library_name: vllm", "pipeline_tag: text-generation"]
    if base_model:
        lines.append(f"base_model: {base_model}")
    lines += ["tags:", "  - dspark", "  - speculative-decoding", "  - draft-model", "---", ""]
    return lines


def _serve_block(recipe: Recipe, draft_dir: Path, repo_id: str) -> list[str]:
    from dspark_cli.serving import serve_command, shell_line

    argv, env = serve_command(recipe, draft_dir, draft_ref=repo_id)
    # the card is for other machines: the target by its hub id, not this machine's path to it
    argv[2] = recipe.target.model
    return ["```bash", shell_line(argv, env), "```"]


def _fmt(value: Any, digits: int = 3) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return f"{value:,}" if isinstance(value, int) else f"{value:.{digits}f}"


def _tau_cell(tau: Estimate) -> str:
    """`2.25 [2.00, 2.50]`; the mean alone when there is no interval (one prompt), `-` with no mean."""
    mean, interval = tau.mean, tau.ci95 or [None, None]
    if not isinstance(mean, (int, float)):
        return "-"
    if all(isinstance(v, (int, float)) for v in interval[:2]) and len(interval) == 2:
        return f"{mean:.2f} [{interval[0]:.2f}, {interval[1]:.2f}]"
    return f"{mean:.2f}"


def _bench_rows(bench: BenchSummary) -> list[str]:
    rows = []
    for run in bench.offline.runs if bench.offline else []:
        if run.threshold != 0.0:
            continue
        rows.append(f"| {run.dataset} | {run.temperature:g} | {run.num_turns} | {_tau_cell(run.tau)} |")
    return rows


def _calibration_rows(bench: BenchSummary) -> list[str]:
    """One row per benched temperature: the confidence head's ECE, Brier score, AUC and verdict."""
    rows = []
    for run in bench.offline.runs if bench.offline else []:
        cal = run.calibration
        if cal and run.threshold == 0.0:
            overall = cal.overall
            rows.append(
                f"| {run.dataset} | {run.temperature:g} | {overall.n} | {_fmt(overall.predicted, 2)} | "
                f"{_fmt(overall.observed, 2)} | {_fmt(overall.ece)} | {_fmt(overall.brier)} | "
                f"{_fmt(overall.auc, 2)} | {cal.verdict} |"
            )
    return rows


def _temperature(value: Any) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def _profile_section(profile: dict[str, Any] | None) -> list[str]:
    """The per-position acceptance table of the acceptance profile: marginal / conditional rate per position."""
    entries = [e for e in (profile or {}).get("profiles") or [] if isinstance(e, dict) and e.get("positions")]
    if not entries:
        return []
    width = max(len(e["positions"]) for e in entries)
    head = " | ".join(f"pos {i + 1}" for i in range(width))
    rows = []
    for entry in entries:
        cells = [f"{_fmt(p.get('marginal'), 2)} / {_fmt(p.get('conditional'), 2)}" for p in entry["positions"]]
        cells += ["-"] * (width - len(cells))
        rows.append(
            f"| {entry.get('dataset')} | {_temperature(entry.get('temperature'))} | {_fmt(entry.get('num_steps'))} | "
            f"{_fmt(entry.get('tau'), 2)} | " + " | ".join(cells) + " |"
        )
    return [
        "## Acceptance per draft position",
        "",
        "From `speculation_profile.json` (in this repository, with the counts behind every rate): per draft "
        "position, the marginal rate P(accepted) / the conditional rate P(accepted | the previous position "
        "accepted), every draft verified.",
        "",
        f"| prompts | temperature | steps | tau | {head} |",
        "|---|---|---|---|" + "---|" * width,
        *rows,
        "",
    ]


def model_card(
    draft_dir: str | Path,
    manifest: dict[str, Any],
    *,
    repo_id: str,
    recipe: Recipe,
    license_id: str,
    bench: BenchSummary | None = None,
    profile: dict[str, Any] | None = None,
) -> str:
    """README.md text for the draft at `draft_dir`, whose dspark_manifest.json is `manifest`; `profile`: the
    acceptance profile of these weights (speculation_profile.json), shown per position."""
    draft_dir = Path(draft_dir)
    config = read_json(draft_dir / "config.json")  # checked by verify_draft before a card is written
    contract = manifest.get("contract", {})
    training = manifest.get("training", {})
    final = training.get("final_metrics") or {}
    target = contract.get("target") or recipe.target.model
    arch = manifest.get("architecture", (config.get("architectures") or ["?"])[0])
    name = repo_id.split("/")[-1]
    num_states = len(contract.get("target_layer_ids", []))

    lines = _front_matter(license_id, target if "/" in str(target) else None)
    lines += [
        f"# {name}",
        "",
        f"A DSpark speculative-decoding draft for `{target}`: it reads {num_states} "
        f"of the target's hidden states, drafts a block of {contract.get('block_size')} tokens in one parallel "
        "pass, and adds a low-rank sequential Markov head and a confidence head. Trained and exported with "
        f"dspark {manifest.get('dspark', __version__)}; the target's embeddings and "
        "LM head are borrowed at load time, not stored here.",
        "",
        "## Serve with vLLM (>= 0.33, CUDA GPU)",
        "",
    ]
    lines += _serve_block(recipe, draft_dir, repo_id)
    lines += [
        "",
        "Serve with the chat template and template arguments the draft was trained with: a mismatch "
        "costs acceptance silently.",
        "",
        "## Draft",
        "",
        "| field | value |",
        "|---|---|",
        f"| architecture | `{arch}` |",
        f"| decoder layers | {config.get('num_hidden_layers')} |",
        f"| hidden size | {config.get('hidden_size')} |",
        f"| block size | {contract.get('block_size')} |",
        f"| target layer ids | {contract.get('target_layer_ids')} |",
        f"| mask token id | {contract.get('mask_token_id')} |",
        f"| Markov rank | {config.get('markov_rank')} |",
        f"| confidence head | {bool(config.get('enable_confidence_head'))} |",
        f"| weights dtype | {manifest.get('dtype')} |",
        "",
    ]
    if training:
        lines += [
            "## Training",
            "",
            "| field | value |",
            "|---|---|",
            f"| steps | {training.get('steps')} |",
            f"| tokens | {_fmt(training.get('tokens'))} |",
            f"| processes | {training.get('world_size')} |",
        ]
        for key, label in (
            ("loss", "final loss"),
            ("acc", "top-1 accuracy (all slots)"),
            ("tau_greedy", "expected tau, greedy (training batches)"),
            ("tau_t1", "expected tau, T=1 (training batches)"),
        ):
            if key in final:
                lines.append(f"| {label} | {_fmt(final[key])} |")
        lines.append("")
    rows = _bench_rows(bench) if bench else []
    if rows:
        lines += [
            "## Measured acceptance",
            "",
            "Tokens accepted per verification step (tau, bonus token included), 95% confidence interval, "
            "measured by `dspark bench` on held-out prompts:",
            "",
            "| prompts | temperature | turns | tau |",
            "|---|---|---|---|",
            *rows,
            "",
        ]
    lines += _profile_section(profile)
    calibration = _calibration_rows(bench) if bench else []
    if calibration:
        lines += [
            "## Confidence head calibration",
            "",
            (
                "The confidence head's predicted acceptance of each reached draft slot against the observed "
                "outcome (what vLLM's adaptive verification relies on): expected calibration error (10 bins), "
                "Brier score, AUC; `miscalibrated` above ECE 0.10, `uninformative` at AUC <= 0.55."
            ),
            "",
            "| prompts | temperature | slots | predicted | observed | ECE | Brier | AUC | verdict |",
            "|---|---|---|---|---|---|---|---|---|",
            *calibration,
            "",
        ]
    lines += [
        "## Contract",
        "",
        "What serving must repeat for the draft to behave as it did in training:",
        "",
        "```json",
        json.dumps(contract, indent=2),
        "```",
        "",
    ]
    return "\n".join(lines)
