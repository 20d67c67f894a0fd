"""The bench report: bench.json (machines), bench.md (people), PNG plots, and rows for the terminal.

    files = write_report(report, "runs/tiny/bench")      # report: a BenchSummary; {"json", "markdown", "plots", ...}
    for title, columns, rows in terminal_tables(report): ...

Reference numbers (`bench.reference`, e.g. `{mt_bench_tau_t1: 3.72}`: the DSpark paper's MT-Bench tau
for Qwen3-8B at T = 1) are matched to runs by `<dataset>_tau_t<temperature>` and shown beside ours.
The report is bench.json's typed records (`dspark_cli.artifacts.bench`), read here by attribute;
bench.json is read back by `read_bench_report` there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dspark_cli.artifacts.bench import (
    REPORT,
    BenchSummary,
    ContextBin,
    Estimate,
    OfflineResults,
    OnlineResults,
    ReferenceRow,
)
from dspark_cli.artifacts.files import sha256_file, write_json_atomic
from dspark_cli.bench.plots import BASELINE_TITLES, draft_baseline_columns


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1000 * seconds:.1f}"


def _tau(stats: Estimate) -> str:
    low, high = stats.ci95
    if stats.mean is None:
        return "-"
    if low is None:
        return f"{stats.mean:.2f}"
    return f"{stats.mean:.2f} [{low:.2f}, {high:.2f}]"


def reference_key(dataset: str, temperature: float) -> str:
    return f"{dataset}_tau_t{temperature:g}"


def reference_rows(report: BenchSummary, reference: dict[str, float]) -> list[ReferenceRow]:
    """One row per reference number: ours (offline tau, and online tau when measured) beside it."""
    offline = {
        reference_key(r.dataset, r.temperature): r.tau.mean for r in (report.offline.runs if report.offline else [])
    }
    online: dict[str, float] = {}
    runs = report.online.endpoint_runs if report.online else None
    if runs is not None and len(runs.datasets) == 1:
        for level in runs.levels:
            tau = level.spec_decode.tau if level.spec_decode else None
            if tau is not None:
                online.setdefault(reference_key(runs.datasets[0], level.temperature), tau)
    return [
        ReferenceRow(key=key, reference=value, offline=offline.get(key), online=online.get(key))
        for key, value in reference.items()
    ]


def terminal_tables(report: BenchSummary) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, columns, rows) for the CLI to render."""
    if report.drafts is not None:
        return compare_tables(report)
    tables = []
    if report.offline:
        tables += offline_tables(report.offline, report.reference or [])
    if report.online:
        tables.append(online_table(report.online))
    return tables


def offline_tables(
    offline: OfflineResults, reference: list[ReferenceRow]
) -> list[tuple[str, list[str], list[list[str]]]]:
    refs = {r.key: r.reference for r in reference}
    engine = offline.engine
    rows = []
    for run in offline.runs:
        accept = " ".join(f"{p.mean:.2f}" if p.mean is not None else "-" for p in run.acceptance_per_position)
        rows.append(
            [
                run.dataset,
                f"{run.temperature:g}",
                _tau(run.tau),
                _fmt(refs.get(reference_key(run.dataset, run.temperature))),
                accept,
                str(run.num_turns),
                _fmt(run.tokens_per_second, 1),
            ]
        )
    tables = [
        (
            f"offline: reference engine, {engine.rejection_sample_method} verification, "
            f"{engine.draft_sample_method} drafts, N={engine.num_speculative_tokens}",
            ["dataset", "T", "tau [95% CI]", "reference", "acceptance by position", "turns", "tok/s"],
            rows,
        )
    ]
    if calibration_rows(offline):
        tables.append(("calibration of the confidence head", CALIBRATION_COLUMNS, calibration_rows(offline)))
    if offline.baselines:
        tables.append(("baselines (same engine, same prompts)", baseline_columns(offline), baseline_rows(offline)))
    if adaptive_rows(offline):
        assert offline.adaptive_verification is not None
        label = offline.adaptive_verification.cost_model.label
        tables.append((f"vLLM adaptive verification, modelled ({label})", ADAPTIVE_COLUMNS, adaptive_rows(offline)))
    if offline.confidence_sweep:
        tables.append(("confidence-scheduled verification", SWEEP_COLUMNS, sweep_rows(offline)))
    return tables


SWEEP_COLUMNS = ["dataset", "T", "threshold", "tau", "verified/step", "tau/verified"]


def sweep_rows(offline: OfflineResults) -> list[list[str]]:
    return [
        [
            r.dataset,
            f"{r.temperature:g}",
            f"{r.threshold:g}",
            _fmt(r.tau),
            _fmt(r.verified_per_step),
            _fmt(r.tokens_per_verified),
        ]
        for r in offline.confidence_sweep
    ]


def online_table(online: OnlineResults) -> tuple[str, list[str], list[list[str]]]:
    speed = {(s.temperature, s.concurrency): s for s in online.speedup or []}
    runs = online.endpoint_runs
    rows = []
    for level in runs.levels if runs else []:
        s = speed.get((level.temperature, level.concurrency))
        rows.append(
            [
                f"{level.temperature:g}",
                str(level.concurrency),
                _fmt(level.output_tokens_per_second, 1),
                _ms(level.ttft_mean),
                _ms(level.tpot_mean),
                _fmt(level.spec_decode.tau if level.spec_decode else None),
                _fmt(s.baseline_output_tokens_per_second if s else None, 1),
                _fmt(s.speedup if s else None),
            ]
        )
    return (
        f"online: {runs.endpoint if runs else None}",
        ["T", "concurrency", "out tok/s", "TTFT ms", "TPOT ms", "tau", "baseline tok/s", "speedup"],
        rows,
    )


def markdown(report: BenchSummary, plots: dict[str, str]) -> str:
    if report.drafts is not None:
        return compare_markdown(report, plots)
    lines = [f"# dspark bench: {report.name}", ""]
    lines.append(f"- target: `{report.target}`")
    if report.draft_dir:
        lines.append(f"- draft: `{report.draft_dir}`")
    lines += [f"- created: {report.created} (dspark {report.dspark})", ""]
    for warning in report.warnings:
        lines.append(f"> warning: {warning}")
    offline = report.offline
    if offline:
        engine = offline.engine
        lines += [
            "## Offline: reference engine",
            "",
            f"{engine.rejection_sample_method} verification, {engine.draft_sample_method} drafts, "
            f"N = {engine.num_speculative_tokens} speculative tokens, top_p {engine.top_p}, "
            f"max_tokens {engine.max_tokens}, {engine.device} {engine.dtype}. tau = tokens per "
            "verification step (bonus included); 95% intervals treat each turn as a cluster.",
            "",
        ]
        _, columns, rows = offline_tables(offline, report.reference or [])[0]
        lines += _md_table(columns, rows)
        lines += ["", "### By category", ""]
        rows = [
            [run.dataset, f"{run.temperature:g}", name, _tau(stats.tau), str(stats.num_turns)]
            for run in offline.runs
            for name, stats in run.by_category.items()
        ]
        lines += _md_table(["dataset", "T", "category", "tau [95% CI]", "turns"], rows)
        lines += calibration_markdown(offline)
        lines += baselines_markdown(offline)
        lines += adaptive_markdown(offline)
        lines += context_markdown(offline)
        if offline.confidence_sweep:
            lines += [
                "",
                "### Confidence-scheduled verification",
                "",
                "Only the drafted prefix whose cumulative confidence stays above the threshold is verified: "
                "how well the confidence head ranks the draft's tokens. This is not vLLM's "
                "`enable_adaptive_verification`, which picks a batch-wide verification budget from a profiled "
                "cost model and keeps the slots most likely to survive; measure that on the server.",
                "",
            ]
            lines += _md_table(SWEEP_COLUMNS, sweep_rows(offline))
    if report.reference:
        lines += ["", "## Reference numbers", ""]
        rows = [[r.key, _fmt(r.reference), _fmt(r.offline), _fmt(r.online)] for r in report.reference]
        lines += _md_table(["key", "reference", "ours (offline)", "ours (online)"], rows)
    online = report.online
    if online:
        lines += ["", "## Online", ""]
        title, columns, rows = online_table(online)
        baseline = online.baseline_runs
        source = (baseline.endpoint or baseline.source) if baseline else None
        lines += [f"{title}; baseline: {source or 'none'}", ""]
        lines += _md_table(columns, rows)
    if plots:
        lines += ["", "## Plots", ""]
        lines += [f"![{name}]({Path(path).name})" for name, path in plots.items()]
    return "\n".join(lines) + "\n"


def calibration_rows(offline: OfflineResults) -> list[list[str]]:
    """One row per run with a confidence head: ECE, Brier, AUC and the verdict."""
    rows = []
    for run in offline.runs:
        cal = run.calibration
        if cal:
            overall = cal.overall
            rows.append(
                [
                    run.dataset,
                    f"{run.temperature:g}",
                    str(overall.n),
                    _fmt(overall.predicted),
                    _fmt(overall.observed),
                    _fmt(overall.ece, 3),
                    _fmt(overall.brier, 3),
                    _fmt(overall.auc),
                    cal.verdict,
                ]
            )
    return rows


CALIBRATION_COLUMNS = ["dataset", "T", "slots", "predicted", "observed", "ECE", "Brier", "AUC", "verdict"]


def calibration_markdown(offline: OfflineResults) -> list[str]:
    rows = calibration_rows(offline)
    if not rows:
        return []
    lines = [
        "",
        "### Calibration of the confidence head",
        "",
        (
            "For every verified draft slot that was reached (the drafts before it accepted): the head's confidence "
            "(predicted acceptance) against whether the slot was accepted. ECE over 10 equal-width bins, Brier "
            "score, AUC (does a higher confidence mean a likelier acceptance?); verdict `miscalibrated` above "
            "ECE 0.10, `uninformative` at AUC <= 0.55. Per position, `survival` is the mean product of the "
            "confidences up to the slot (what vLLM's adaptive verification ranks by) beside the observed "
            "acceptance rate of that position. Reliability diagram: `calibration.png`."
        ),
        "",
    ]
    lines += _md_table(CALIBRATION_COLUMNS, rows)
    for run in offline.runs:
        cal = run.calibration
        if not cal:
            continue
        lines += ["", f"{run.dataset} T={run.temperature:g}: {cal.verdict} ({'; '.join(cal.reasons)})", ""]
        rows = [
            [
                str(p.position),
                str(p.n),
                _fmt(p.predicted),
                _fmt(p.observed),
                _fmt(p.ece, 3),
                _fmt(p.brier, 3),
                _fmt(p.predicted_survival),
                _fmt(p.observed_acceptance),
            ]
            for p in cal.positions
        ]
        lines += _md_table(
            ["position", "slots reached", "predicted", "observed", "ECE", "Brier", "survival", "acceptance"], rows
        )
    return lines


BASELINE_NAMES = BASELINE_TITLES


def baseline_rows(offline: OfflineResults) -> list[list[str]]:
    """Per dataset and temperature: the draft's tau beside each baseline's, with 95% intervals."""
    rows = []
    for run in offline.runs:
        row = [run.dataset, f"{run.temperature:g}", _tau(run.tau)]
        for name in offline.baseline_names():
            match = offline.baseline(name, run)
            row.append(_tau(match.tau) if match else "-")
        rows.append(row)
    return rows


def baseline_columns(offline: OfflineResults) -> list[str]:
    return ["dataset", "T", "draft tau [95% CI]", *[BASELINE_NAMES.get(n, n) for n in offline.baseline_names()]]


def baselines_markdown(offline: OfflineResults) -> list[str]:
    if not offline.baselines:
        return []
    return [
        "",
        "### Baselines (same engine, same prompts)",
        "",
        (
            f"tau per verification step with the draft, with vLLM's n-gram proposer (prompt lookup, "
            f"`prompt_lookup_min/max` {offline.engine.prompt_lookup or '-'}; a step without a match verifies the "
            "anchor alone and counts 1), and with the draft's architecture freshly initialised. No speculation "
            "is 1.00. Plot: `baselines.png`."
        ),
        "",
        *_md_table(baseline_columns(offline), baseline_rows(offline)),
    ]


def adaptive_rows(offline: OfflineResults) -> list[list[str]]:
    rows = []
    for run in offline.adaptive_verification.runs if offline.adaptive_verification else []:
        for level in run.levels:
            fixed, adaptive, none = level.fixed, level.adaptive, level.none
            rows.append(
                [
                    run.dataset,
                    f"{run.temperature:g}",
                    str(level.concurrency),
                    _fmt(fixed.tokens_per_step),
                    _fmt(adaptive.tokens_per_step),
                    _fmt(adaptive.drafts_per_request),
                    _fmt(none.tokens_per_second, 0),
                    _fmt(fixed.tokens_per_second, 0),
                    _fmt(adaptive.tokens_per_second, 0),
                    _fmt(adaptive.tokens_per_second / none.tokens_per_second),
                ]
            )
    return rows


ADAPTIVE_COLUMNS = [
    "dataset",
    "T",
    "concurrency",
    "tokens/step fixed",
    "tokens/step adaptive",
    "drafts/request adaptive",
    "tok/s none",
    "tok/s fixed",
    "tok/s adaptive",
    "adaptive / none",
]


def adaptive_markdown(offline: OfflineResults) -> list[str]:
    model = offline.adaptive_verification
    if not model or not model.runs:
        return []
    cost = model.cost_model
    label = cost.label + (" -- an ESTIMATE, not a measurement" if cost.estimate else "")
    return [
        "",
        "### vLLM adaptive verification across concurrency (model)",
        "",
        (
            f"Cost model: {label}. vLLM's `enable_adaptive_verification` policy (budget from the cost model, "
            "slots by survival across the batch) replayed on this run's recorded confidences and acceptances, "
            "against verifying every draft (fixed-k) and no speculation. Tokens per verification step are per "
            "request; tokens/s are modelled from the cost model, not measured. How to read it: docs/bench.md. "
            "Plot: `adaptive_verification.png`."
        ),
        "",
        *_md_table(ADAPTIVE_COLUMNS, adaptive_rows(offline)),
    ]


def context_markdown(offline: OfflineResults) -> list[str]:
    blocks: list[tuple[str, list[ContextBin], str | None]] = [
        (f"{run.dataset} T={run.temperature:g}", run.by_context, None) for run in offline.runs
    ]
    blocks += [
        (
            f"{s.dataset} T={s.temperature:g} (context sweep: {s.num_conversations} conversations, "
            f"{s.num_turns} turns, longest context {s.longest_context} of {s.max_model_len} tokens)",
            s.bins,
            s.note,
        )
        for s in offline.context_sweep
    ]
    if not any(bins for _, bins, _ in blocks):
        return []
    from dspark_cli.bench.context import drop_note

    lines = [
        "",
        "### Acceptance by context length",
        "",
        (
            "Every verification step binned by the tokens before its anchor (prompt, earlier turns and the "
            "answer so far); `bench.context_sweep: true` adds long conversations of the prompts, each filled up "
            "to `target.max_model_len`. Intervals: 95% t intervals over the bin's turns, clipped to "
            "[1, N + 1]; a bin of one turn has none. Plot: `context_sweep.png`."
        ),
        "",
    ]
    for title, bins, note in blocks:
        if not bins:
            continue
        lines += [f"{title}: {note or drop_note([b.to_dict() for b in bins])}", ""]
        rows = [
            [
                f"{b.low}-{b.high}",
                str(b.num_steps),
                str(b.num_turns),
                _tau(b.tau),
                " ".join(_fmt(p) for p in b.acceptance_per_position),
            ]
            for b in bins
        ]
        lines += _md_table(["context tokens", "steps", "turns", "tau [95% CI]", "acceptance by position"], rows)
        lines.append("")
    return lines


# --- several drafts in one report (`dspark bench A B --offline`) ---------------------------------------------


def compare_rows(report: BenchSummary) -> tuple[list[str], list[list[str]]]:
    """Per dataset x temperature: each draft's tau with its 95% interval, the reference, the baselines once."""
    drafts = report.drafts or []
    refs = {r.key: r.reference for r in report.reference or []}
    baselines = draft_baseline_columns(drafts)
    columns = ["dataset", "T", *[f"{d.name} tau [95% CI]" for d in drafts]]
    columns += ["reference"] if refs else []
    columns += [title for title, _, _ in baselines]
    rows = []
    for run in drafts[0].offline.runs if drafts else []:
        key = (run.dataset, run.temperature)
        row = [run.dataset, f"{run.temperature:g}"]
        for draft in drafts:
            match = next((r for r in draft.offline.runs if (r.dataset, r.temperature) == key), None)
            row.append(_tau(match.tau) if match else "-")
        row += [_fmt(refs.get(reference_key(*key)))] if refs else []
        for _, name, (index, *_) in baselines:
            found = drafts[index].offline.baseline(name, run)
            row.append(_tau(found.tau) if found else "-")
        rows.append(row)
    return columns, rows


POSITION_COLUMNS = ["draft", "dataset", "T", "N", "acceptance by position", "turns", "tok/s"]


def position_rows(report: BenchSummary) -> list[list[str]]:
    return [
        [
            draft.name,
            run.dataset,
            f"{run.temperature:g}",
            str(draft.offline.engine.num_speculative_tokens),
            " ".join(_fmt(p.mean) for p in run.acceptance_per_position),
            str(run.num_turns),
            _fmt(run.tokens_per_second, 1),
        ]
        for draft in report.drafts or []
        for run in draft.offline.runs
    ]


def compare_tables(report: BenchSummary) -> list[tuple[str, list[str], list[list[str]]]]:
    drafts = report.drafts or []
    engine = drafts[0].offline.engine if drafts else None
    how = f", {engine.rejection_sample_method} verification, {engine.draft_sample_method} drafts" if engine else ""
    columns, rows = compare_rows(report)
    tables = [
        (f"offline: {len(drafts)} drafts, same prompts and seeds{how}", columns, rows),
        ("acceptance by position", POSITION_COLUMNS, position_rows(report)),
    ]
    calibration = [[d.name, *row] for d in drafts for row in calibration_rows(d.offline)]
    if calibration:
        tables.append(("calibration of the confidence heads", ["draft", *CALIBRATION_COLUMNS], calibration))
    return tables


def compare_markdown(report: BenchSummary, plots: dict[str, str]) -> str:
    drafts = report.drafts or []
    lines = [f"# dspark bench: {report.name}, {len(drafts)} drafts", "", f"- target: `{report.target}`"]
    for draft in drafts:
        kind = "published draft (no dspark manifest)" if draft.published else "dspark export"
        lines.append(
            f"- draft {draft.name}: `{draft.draft_dir}` ({kind}, N = {draft.offline.engine.num_speculative_tokens})"
        )
    lines += [f"- created: {report.created} (dspark {report.dspark})", ""]
    lines += [f"> warning: {warning}" for warning in report.warnings] + ([""] if report.warnings else [])
    engine = drafts[0].offline.engine if drafts else None
    if engine is not None:
        lines += [
            "## Offline: reference engine, drafts compared",
            "",
            f"Every draft ran the same prompts with the same seeds and settings, on one target: "
            f"{engine.rejection_sample_method} verification, {engine.draft_sample_method} drafts, top_p "
            f"{engine.top_p}, max_tokens {engine.max_tokens}, {engine.device} {engine.dtype}. tau = tokens per "
            "verification step (bonus included); 95% intervals treat each turn as a cluster. Baselines run in the "
            "same engine on the same prompts, shown once where they gave every draft the same numbers.",
            "",
        ]
        for title, columns, rows in compare_tables(report):
            lines += ["", f"### {title[0].upper()}{title[1:]}", ""] if not title.startswith("offline") else []
            lines += _md_table(columns, rows)
    if plots:
        lines += ["", "## Plots", ""]
        lines += [f"![{name}]({Path(path).name})" for name, path in plots.items()]
    return "\n".join(lines) + "\n"


def _md_table(columns: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows]
    return out


def write_report(report: BenchSummary, out_dir: str | Path, *, profile: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write bench.json, bench.md, the plots and the acceptance `profile` (speculation_profile.json, when given)
    into out_dir; return their names there (also `report.files`: names in the report folder, never this machine's
    paths, since publish uploads bench.json; `report.local`)."""
    from dspark_cli.bench.plots import write_plots

    out = Path(out_dir)
    report.report_dir = out
    files: dict[str, Any] = {"json": REPORT, "markdown": "bench.md", "plots": {}}
    report.files = files
    write_json_atomic(out / REPORT, report.to_dict())  # the measurements first: plotting can still fail
    plots = {name: Path(path).name for name, path in write_plots(report, out).items()}
    files["plots"] = plots
    write_json_atomic(out / REPORT, report.to_dict())
    tmp = out / ".bench.md.tmp"
    tmp.write_text(markdown(report, plots), encoding="utf-8")
    tmp.replace(out / "bench.md")
    extra = []
    if profile is not None:
        from dspark_cli.artifacts.profile import PROFILE

        write_json_atomic(out / PROFILE, profile)
        files["profile"] = PROFILE
        extra.append(PROFILE)
    # what publish may upload beside bench.json: exactly these files, as written here
    files["checksums"] = {name: sha256_file(out / name) for name in ["bench.md", *plots.values(), *extra]}
    write_json_atomic(out / REPORT, report.to_dict())
    return files
