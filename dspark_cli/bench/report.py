"""The bench report: bench.json (machines), bench.md (people), PNG plots, and rows for the terminal.

    files = write_report(result, "runs/tiny/bench")      # {"json": ..., "markdown": ..., "plots": {...}}
    for title, columns, rows in terminal_tables(result): ...

Reference numbers (`bench.reference`, e.g. `{mt_bench_tau_t1: 3.72}`: the DSpark paper's MT-Bench tau
for Qwen3-8B at T = 1) are matched to runs by `<dataset>_tau_t<temperature>` and shown beside ours.
bench.json is read back by `dspark_cli.artifacts.bench.read_bench_report`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dspark_cli.artifacts.bench import REPORT
from dspark_cli.artifacts.files import sha256_file, write_json_atomic


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1000 * seconds:.1f}"


def _tau(stats: dict[str, Any]) -> str:
    low, high = stats["ci95"]
    if stats["mean"] is None:
        return "-"
    if low is None:
        return f"{stats['mean']:.2f}"
    return f"{stats['mean']:.2f} [{low:.2f}, {high:.2f}]"


def reference_key(dataset: str, temperature: float) -> str:
    return f"{dataset}_tau_t{temperature:g}"


def reference_rows(result: dict[str, Any], reference: dict[str, float]) -> list[dict[str, Any]]:
    """One row per reference number: ours (offline tau, and online tau when measured) beside it."""
    offline = {
        reference_key(r["dataset"], r["temperature"]): r["tau"]["mean"]
        for r in (result.get("offline") or {}).get("runs", [])
    }
    online: dict[str, float] = {}
    online_part = result.get("online") or {}
    datasets = online_part.get("endpoint_runs", {}).get("datasets", [])
    if len(datasets) == 1:
        for level in online_part["endpoint_runs"]["levels"]:
            tau = (level.get("spec_decode") or {}).get("tau")
            if tau is not None:
                online.setdefault(reference_key(datasets[0], level["temperature"]), tau)
    return [
        {"key": key, "reference": value, "offline": offline.get(key), "online": online.get(key)}
        for key, value in reference.items()
    ]


def terminal_tables(result: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, columns, rows) for the CLI to render."""
    tables = []
    offline = result.get("offline")
    refs = {r["key"]: r["reference"] for r in result.get("reference", [])}
    if offline:
        n = offline["engine"]["num_speculative_tokens"]
        rows = []
        for run in offline["runs"]:
            accept = " ".join(
                f"{p['mean']:.2f}" if p["mean"] is not None else "-" for p in run["acceptance_per_position"]
            )
            rows.append(
                [
                    run["dataset"],
                    f"{run['temperature']:g}",
                    _tau(run["tau"]),
                    _fmt(refs.get(reference_key(run["dataset"], run["temperature"]))),
                    accept,
                    str(run["num_turns"]),
                    _fmt(run["tokens_per_second"], 1),
                ]
            )
        tables.append(
            (
                f"offline: reference engine, {offline['engine']['rejection_sample_method']} verification, "
                f"{offline['engine']['draft_sample_method']} drafts, N={n}",
                ["dataset", "T", "tau [95% CI]", "reference", "acceptance by position", "turns", "tok/s"],
                rows,
            )
        )
        if calibration_rows(offline):
            tables.append(("calibration of the confidence head", CALIBRATION_COLUMNS, calibration_rows(offline)))
        if offline.get("baselines"):
            tables.append(("baselines (same engine, same prompts)", baseline_columns(offline), baseline_rows(offline)))
        if adaptive_rows(offline):
            cost = offline["adaptive_verification"]["cost_model"]
            tables.append(
                (f"vLLM adaptive verification, modelled ({cost['label']})", ADAPTIVE_COLUMNS, adaptive_rows(offline))
            )
        if offline.get("confidence_sweep"):
            rows = [
                [
                    r["dataset"],
                    f"{r['temperature']:g}",
                    f"{r['threshold']:g}",
                    _fmt(r["tau"]),
                    _fmt(r["verified_per_step"]),
                    _fmt(r["tokens_per_verified"]),
                ]
                for r in offline["confidence_sweep"]
            ]
            tables.append(
                (
                    "confidence-scheduled verification",
                    ["dataset", "T", "threshold", "tau", "verified/step", "tau/verified"],
                    rows,
                )
            )
    online = result.get("online")
    if online:
        speed = {(s["temperature"], s["concurrency"]): s for s in online.get("speedup", [])}
        rows = []
        for level in online["endpoint_runs"]["levels"]:
            spec = level.get("spec_decode") or {}
            s = speed.get((level["temperature"], level["concurrency"]), {})
            rows.append(
                [
                    f"{level['temperature']:g}",
                    str(level["concurrency"]),
                    _fmt(level["output_tokens_per_second"], 1),
                    _ms(level["ttft_mean"]),
                    _ms(level["tpot_mean"]),
                    _fmt(spec.get("tau")),
                    _fmt(s.get("baseline_output_tokens_per_second"), 1),
                    _fmt(s.get("speedup")),
                ]
            )
        tables.append(
            (
                f"online: {online['endpoint_runs']['endpoint']}",
                ["T", "concurrency", "out tok/s", "TTFT ms", "TPOT ms", "tau", "baseline tok/s", "speedup"],
                rows,
            )
        )
    return tables


def markdown(result: dict[str, Any], plots: dict[str, str]) -> str:
    lines = [f"# dspark bench: {result.get('name', '')}", ""]
    lines.append(f"- target: `{result.get('target')}`")
    if result.get("draft_dir"):
        lines.append(f"- draft: `{result['draft_dir']}`")
    lines += [f"- created: {result.get('created')} (dspark {result.get('dspark')})", ""]
    for warning in result.get("warnings", []):
        lines.append(f"> warning: {warning}")
    offline = result.get("offline")
    if offline:
        engine = offline["engine"]
        lines += [
            "## Offline: reference engine",
            "",
            f"{engine['rejection_sample_method']} verification, {engine['draft_sample_method']} drafts, "
            f"N = {engine['num_speculative_tokens']} speculative tokens, top_p {engine['top_p']}, "
            f"max_tokens {engine['max_tokens']}, {engine['device']} {engine['dtype']}. tau = tokens per "
            "verification step (bonus included); 95% intervals treat each turn as a cluster.",
            "",
        ]
        for title, columns, rows in terminal_tables({"offline": offline, "reference": result.get("reference", [])})[:1]:
            lines += _md_table(columns, rows)
        lines += ["", "### By category", ""]
        rows = [
            [run["dataset"], f"{run['temperature']:g}", name, _tau(stats["tau"]), str(stats["num_turns"])]
            for run in offline["runs"]
            for name, stats in run["by_category"].items()
        ]
        lines += _md_table(["dataset", "T", "category", "tau [95% CI]", "turns"], rows)
        lines += calibration_markdown(offline)
        lines += baselines_markdown(offline)
        lines += adaptive_markdown(offline)
        lines += context_markdown(offline)
        if offline.get("confidence_sweep"):
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
            _, columns, rows = next(
                t for t in terminal_tables({"offline": offline}) if t[0] == "confidence-scheduled verification"
            )
            lines += _md_table(columns, rows)
    if result.get("reference"):
        lines += ["", "## Reference numbers", ""]
        rows = [[r["key"], _fmt(r["reference"]), _fmt(r["offline"]), _fmt(r["online"])] for r in result["reference"]]
        lines += _md_table(["key", "reference", "ours (offline)", "ours (online)"], rows)
    online = result.get("online")
    if online:
        lines += ["", "## Online", ""]
        title, columns, rows = terminal_tables({"online": online})[0]
        lines += [
            f"{title}; baseline: "
            f"{(online.get('baseline_runs') or {}).get('endpoint') or (online.get('baseline_runs') or {}).get('source') or 'none'}",
            "",
        ]
        lines += _md_table(columns, rows)
    if plots:
        lines += ["", "## Plots", ""]
        lines += [f"![{name}]({Path(path).name})" for name, path in plots.items()]
    return "\n".join(lines) + "\n"


def calibration_rows(offline: dict[str, Any]) -> list[list[str]]:
    """One row per run with a confidence head: ECE, Brier, AUC and the verdict."""
    rows = []
    for run in offline.get("runs", []):
        cal = run.get("calibration")
        if cal:
            overall = cal["overall"]
            rows.append(
                [
                    run["dataset"],
                    f"{run['temperature']:g}",
                    str(overall["n"]),
                    _fmt(overall["predicted"]),
                    _fmt(overall["observed"]),
                    _fmt(overall["ece"], 3),
                    _fmt(overall["brier"], 3),
                    _fmt(overall["auc"]),
                    cal["verdict"],
                ]
            )
    return rows


CALIBRATION_COLUMNS = ["dataset", "T", "slots", "predicted", "observed", "ECE", "Brier", "AUC", "verdict"]


def calibration_markdown(offline: dict[str, Any]) -> list[str]:
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
    for run in offline["runs"]:
        cal = run.get("calibration")
        if not cal:
            continue
        lines += ["", f"{run['dataset']} T={run['temperature']:g}: {cal['verdict']} ({'; '.join(cal['reasons'])})", ""]
        rows = [
            [
                str(p["position"]),
                str(p["n"]),
                _fmt(p["predicted"]),
                _fmt(p["observed"]),
                _fmt(p["ece"], 3),
                _fmt(p["brier"], 3),
                _fmt(p["predicted_survival"]),
                _fmt(p["observed_acceptance"]),
            ]
            for p in cal["positions"]
        ]
        lines += _md_table(
            ["position", "slots reached", "predicted", "observed", "ECE", "Brier", "survival", "acceptance"], rows
        )
    return lines


BASELINE_NAMES = {"ngram": "n-gram (prompt lookup)", "untrained": "untrained draft"}


def baseline_rows(offline: dict[str, Any]) -> list[list[str]]:
    """Per dataset and temperature: the draft's tau beside each baseline's, with 95% intervals."""
    rows = []
    for run in offline.get("runs", []):
        row = [run["dataset"], f"{run['temperature']:g}", _tau(run["tau"])]
        for name in dict.fromkeys(b["name"] for b in offline.get("baselines", [])):
            match = next(
                (
                    b
                    for b in offline["baselines"]
                    if b["name"] == name and b["dataset"] == run["dataset"] and b["temperature"] == run["temperature"]
                ),
                None,
            )
            row.append(_tau(match["tau"]) if match else "-")
        rows.append(row)
    return rows


def baseline_columns(offline: dict[str, Any]) -> list[str]:
    names = dict.fromkeys(b["name"] for b in offline.get("baselines", []))
    return ["dataset", "T", "draft tau [95% CI]", *[BASELINE_NAMES.get(n, n) for n in names]]


def baselines_markdown(offline: dict[str, Any]) -> list[str]:
    if not offline.get("baselines"):
        return []
    engine = offline["engine"]
    return [
        "",
        "### Baselines (same engine, same prompts)",
        "",
        (
            f"tau per verification step with the draft, with vLLM's n-gram proposer (prompt lookup, "
            f"`prompt_lookup_min/max` {engine.get('prompt_lookup', '-')}; a step without a match verifies the "
            "anchor alone and counts 1), and with the draft's architecture freshly initialised. No speculation "
            "is 1.00. Plot: `baselines.png`."
        ),
        "",
        *_md_table(baseline_columns(offline), baseline_rows(offline)),
    ]


def adaptive_rows(offline: dict[str, Any]) -> list[list[str]]:
    rows = []
    for run in (offline.get("adaptive_verification") or {}).get("runs", []):
        for level in run["levels"]:
            fixed, adaptive, none = level["fixed"], level["adaptive"], level["none"]
            rows.append(
                [
                    run["dataset"],
                    f"{run['temperature']:g}",
                    str(level["concurrency"]),
                    _fmt(fixed["tokens_per_step"]),
                    _fmt(adaptive["tokens_per_step"]),
                    _fmt(adaptive["drafts_per_request"]),
                    _fmt(none["tokens_per_second"], 0),
                    _fmt(fixed["tokens_per_second"], 0),
                    _fmt(adaptive["tokens_per_second"], 0),
                    _fmt(adaptive["tokens_per_second"] / none["tokens_per_second"]),
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


def adaptive_markdown(offline: dict[str, Any]) -> list[str]:
    model = offline.get("adaptive_verification")
    if not model or not model.get("runs"):
        return []
    cost = model["cost_model"]
    label = cost["label"] + (" -- an ESTIMATE, not a measurement" if cost["estimate"] else "")
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


def context_markdown(offline: dict[str, Any]) -> list[str]:
    blocks = [
        (f"{run['dataset']} T={run['temperature']:g}", run.get("by_context") or [], None)
        for run in offline.get("runs", [])
    ]
    blocks += [
        (
            f"{s['dataset']} T={s['temperature']:g} (context sweep: {s['num_conversations']} conversations, "
            f"{s['num_turns']} turns, longest context {s['longest_context']} of {s['max_model_len']} tokens)",
            s["bins"],
            s["note"],
        )
        for s in offline.get("context_sweep", [])
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
        lines += [f"{title}: {note or drop_note(bins)}", ""]
        rows = [
            [
                f"{b['low']}-{b['high']}",
                str(b["num_steps"]),
                str(b["num_turns"]),
                _tau(b["tau"]),
                " ".join(_fmt(p) for p in b["acceptance_per_position"]),
            ]
            for b in bins
        ]
        lines += _md_table(["context tokens", "steps", "turns", "tau [95% CI]", "acceptance by position"], rows)
        lines.append("")
    return lines


def _md_table(columns: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows]
    return out


def write_report(result: dict[str, Any], out_dir: str | Path) -> dict[str, Any]:
    """Write bench.json, bench.md and the plots into out_dir; return their paths."""
    from dspark_cli.bench.plots import write_plots

    out = Path(out_dir)
    files: dict[str, Any] = {"json": str(out / REPORT), "markdown": str(out / "bench.md"), "plots": {}}
    result["files"] = files
    write_json_atomic(out / REPORT, result)  # the measurements first: plotting can still fail
    files["plots"] = plots = write_plots(result, result.get("reference", []), out)
    write_json_atomic(out / REPORT, result)
    tmp = out / ".bench.md.tmp"
    tmp.write_text(markdown(result, plots), encoding="utf-8")
    tmp.replace(out / "bench.md")
    # what publish may upload beside bench.json: exactly these files, as written here
    files["checksums"] = {Path(p).name: sha256_file(p) for p in [out / "bench.md", *plots.values()]}
    write_json_atomic(out / REPORT, result)
    return files
