"""The acceptance profile built from a bench, and the num_speculative_tokens it recommends for serving.

    dspark bench runs/tiny/draft --offline     # runs/tiny/bench/speculation_profile.json beside bench.json
    dspark export runs/tiny/train --force      # again after bench: the profile goes into runs/tiny/draft
    dspark serve runs/tiny/draft --dry-run --explain   # the num_speculative_tokens it recommends, and why

    doc = build_profile(summary.offline, draft_fingerprint(manifest), created=summary.created)   # bench/run.py
    advice = recommend(doc, cost=load_cost_model("h200-estimate"), temperature=0.0)          # cli/serve.py

Rates come from bench.json's offline runs at confidence threshold 0 (every draft verified): position i is
accepted in a step when at least i + 1 drafts were, so `accepted[i] = round(marginal[i] * steps)` is exact
and acceptance is a prefix (`accepted[i] <= accepted[i - 1]`). Two conventions, both published and labelled
as Model Optimizer's profiles do (dynamo's simulator wants conditional rates; vLLM's synthetic sampler and
bench.json's per-position figures are marginal): marginal P(i accepted) = accepted[i] / steps, conditional
P(i accepted | i - 1 accepted) = accepted[i] / accepted[i - 1] (position 0: / steps); tau = 1 + the sum of
the marginals. The recommendation is the k maximising the throughput `adaptive.fixed_k_throughput` models
on the bench's cost model (`bench.cost_model`). The file itself (reader, fingerprint, lookup): artifacts/profile.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from dspark_cli import __version__
from dspark_cli.artifacts.profile import CONVENTIONS, FORMAT, VERSION

if TYPE_CHECKING:
    from dspark_cli.artifacts.bench import OfflineResults
    from dspark_cli.bench.adaptive import CostModel


def _entry(run: Any) -> dict[str, Any]:
    """One dataset at one temperature: counts per position, both rates, tau."""
    steps = run.num_steps
    accepted = [round((p.mean or 0.0) * p.n) if p.n else 0 for p in run.acceptance_per_position]
    positions, given = [], steps
    for i, (count, estimate) in enumerate(zip(accepted, run.acceptance_per_position, strict=True)):
        positions.append(
            {
                "position": i,
                "accepted": count,
                "steps": steps,
                "given": given,
                "marginal": estimate.mean,
                "marginal_ci95": estimate.ci95,
                "conditional": count / given if given else None,
            }
        )
        given = count
    return {
        "dataset": run.dataset,
        "temperature": run.temperature,
        "num_turns": run.num_turns,
        "num_steps": steps,
        "tau": run.tau.mean,
        "tau_ci95": run.tau.ci95,
        "marginal_accept_rates": [p["marginal"] for p in positions],
        "conditional_accept_rates": [p["conditional"] for p in positions],
        "positions": positions,
    }


def build_profile(offline: OfflineResults, fingerprint: dict[str, Any], *, created: str = "") -> dict[str, Any]:
    """One draft's profile document from its offline results (bench.json's `offline`, typed)."""
    engine = offline.engine
    return {
        "format": FORMAT,
        "version": VERSION,
        "dspark": __version__,
        "created": created,
        "conventions": CONVENTIONS,
        "draft": fingerprint,
        "measurement": {
            "source": "bench.json",
            "engine": engine.engine,
            "target": engine.target,
            "num_speculative_tokens": engine.num_speculative_tokens,
            "draft_sample_method": engine.draft_sample_method,
            "rejection_sample_method": engine.rejection_sample_method,
            "top_p": engine.top_p,
            "max_tokens": engine.max_tokens,
            "chat_template_sha256": engine.chat_template_sha256,
        },
        "profiles": [_entry(run) for run in offline.runs if run.threshold == 0.0],
    }


def _entries_at(doc: dict[str, Any], temperature: float | None) -> list[dict[str, Any]]:
    """The profile's entries at the profiled temperature nearest `temperature` (every entry when None)."""
    entries = [e for e in doc.get("profiles") or [] if isinstance(e, dict) and e.get("marginal_accept_rates")]
    if temperature is None or not entries:
        return entries
    nearest = min({e["temperature"] for e in entries}, key=lambda t: (abs(t - temperature), t))
    return [e for e in entries if e["temperature"] == nearest]


def pooled_acceptance(entries: list[dict[str, Any]]) -> list[float]:
    """Marginal acceptance per position pooled over entries (datasets) by their counts: sum accepted / sum steps."""
    width = min(len(e["positions"]) for e in entries)
    steps = sum(e["num_steps"] for e in entries)
    return [sum(e["positions"][i]["accepted"] for e in entries) / steps if steps else 0.0 for i in range(width)]


def recommend(
    doc: dict[str, Any],
    *,
    cost: CostModel,
    temperature: float | None = None,
    concurrency: int = 1,
    max_k: int | None = None,
) -> list[dict[str, Any]]:
    """The recommended num_speculative_tokens per profiled temperature (the one nearest `temperature`, or
    every one): the k in 1 .. max_k (default the profile's positions) maximising the throughput modelled by
    `adaptive.fixed_k_throughput` on the cost model, the first on ties. Each: {temperature, datasets,
    num_steps, k, rows (every k, k = 0 no speculation), speculation_pays}."""
    from dspark_cli.bench.adaptive import fixed_k_throughput

    out = []
    entries = _entries_at(doc, temperature)
    for temp in sorted({e["temperature"] for e in entries}):
        here = [e for e in entries if e["temperature"] == temp]
        acceptance = pooled_acceptance(here)[: max_k or None]
        rows = fixed_k_throughput(acceptance, cost, concurrency=concurrency)
        best = max(rows[1:], key=lambda r: r["tokens_per_second"], default=None)
        if best is None:
            continue
        out.append(
            {
                "temperature": temp,
                "datasets": [e["dataset"] for e in here],
                "num_steps": sum(e["num_steps"] for e in here),
                "k": best["k"],
                "rows": rows,
                "speculation_pays": best["tokens_per_second"] > rows[0]["tokens_per_second"],
            }
        )
    return out


def advice_lines(
    draft_dir: str | Path,
    bench_dir: str | Path,
    *,
    cost_spec: Any,
    temperature: float | None,
    concurrency: int,
    configured: int | None,
    block_size: int,
    explain: bool,
) -> list[str]:
    """What `dspark serve` prints: the recommended num_speculative_tokens from the profile of the weights in
    `draft_dir` (its own, else `bench_dir`'s), and with `explain` the modelled throughput per k; a line saying
    how to get a profile when there is none (with `explain` only). A recommendation, never applied."""
    from dspark_cli.artifacts.profile import find_profile
    from dspark_cli.bench.adaptive import load_cost_model

    found = find_profile(draft_dir, bench_dir)
    if found is None:
        return (
            [
                f"no acceptance profile for the weights in {draft_dir}: `dspark bench {draft_dir} --offline` "
                "writes one (speculation_profile.json), `dspark export` copies it into the draft"
            ]
            if explain
            else []
        )
    doc, where = found
    cost = load_cost_model(cost_spec)
    advice = recommend(doc, cost=cost, temperature=temperature, concurrency=concurrency, max_k=block_size)
    now = configured if configured is not None else block_size
    lines = []
    for item in advice:
        note = "" if item["k"] == now else f" (serving with {now}: set serve.num_speculative_tokens={item['k']})"
        lines.append(
            f"recommended num_speculative_tokens at T={item['temperature']:g}: {item['k']}{note}"
            + ("" if item["speculation_pays"] else "; the model has the target alone faster at this concurrency")
        )
        if explain:
            lines.append(
                f"  from {where} ({', '.join(item['datasets'])}, {item['num_steps']} verification steps), "
                f"concurrency {concurrency}, cost model: {cost.label}{' (an estimate)' if cost.estimate else ''}"
            )
            lines.append("  k  tokens/step  step ms  modelled tokens/s")
            for row in item["rows"]:
                mark = "  <- recommended" if row["k"] == item["k"] else "  (no speculation)" if row["k"] == 0 else ""
                lines.append(
                    f"  {row['k']:>1}  {row['tokens_per_step']:>11.3f}  {row['step_ms']:>7.3f}  "
                    f"{row['tokens_per_second']:>17.1f}{mark}"
                )
    if explain and advice:
        lines.append(
            "  fixed-k verification modelled from the marginal acceptance per position (bench/adaptive.py); "
            "with adaptive verification on, k is the most vLLM verifies"
        )
    return lines
