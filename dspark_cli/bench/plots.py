"""PNG plots of a bench result (matplotlib, imported here only, with the non-interactive Agg backend).

    files = write_plots(report, Path("runs/tiny/bench"))   # report: a BenchSummary -> {"acceptance_per_position": ".../x.png", ...}

Each PNG records what it shows in its metadata (`Description`: JSON with the plot kind and its series
labels), so tests and scripts can check a plot without reading pixels:
`json.loads(PIL.Image.open(path).text["Description"])["series"]`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dspark_cli.artifacts.bench import BenchSummary, ContextBin, DraftResults, Estimate, OnlineResults


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path, kind: str, series: list[str]) -> str:
    meta = {"Description": json.dumps({"kind": kind, "series": series}), "Software": "dspark bench"}
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, dpi=110, format="png", metadata=meta)
    tmp.replace(path)
    _pyplot().close(fig)
    return str(path)


def run_label(run: Any) -> str:
    """`dataset T=t` of anything measured on one dataset at one temperature."""
    return f"{run.dataset} T={run.temperature:g}"


def online_per_temperature(online: OnlineResults) -> dict[float, list[float]]:
    """Per temperature: per-position acceptance pooled over the concurrency levels' counter deltas."""
    pooled: dict[float, tuple[float, list[float]]] = {}
    for level in online.endpoint_runs.levels if online.endpoint_runs else []:
        spec = level.spec_decode
        if not spec or not spec.num_drafts:
            continue
        drafts, per_pos = pooled.get(level.temperature, (0.0, []))
        counts = spec.num_accepted_tokens_per_pos
        per_pos = [a + b for a, b in zip(per_pos + [0.0] * (len(counts) - len(per_pos)), counts, strict=False)]
        pooled[level.temperature] = (drafts + spec.num_drafts, per_pos)
    return {t: [c / d for c in counts] for t, (d, counts) in pooled.items()}


def plot_acceptance(report: BenchSummary, path: Path) -> str | None:
    plt = _pyplot()
    series = []
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for run in report.offline.runs if report.offline else []:
        rates = [p.mean for p in run.acceptance_per_position]
        ax.plot(range(1, len(rates) + 1), rates, marker="o", label=f"offline {run_label(run)}")
        series.append(f"offline {run_label(run)}")
    if report.online:
        for temperature, pooled in sorted(online_per_temperature(report.online).items()):
            label = f"online T={temperature:g}"
            ax.plot(range(1, len(pooled) + 1), pooled, marker="s", linestyle="--", label=label)
            series.append(label)
    if not series:
        plt.close(fig)
        return None
    ax.set(
        xlabel="draft position",
        ylabel="acceptance rate (per drafting step)",
        ylim=(0, 1.02),
        title="Per-position acceptance",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path, "acceptance_per_position", series)


def plot_tau_by_category(report: BenchSummary, path: Path) -> str | None:
    runs = report.offline.runs if report.offline else []
    if not runs:
        return None
    plt = _pyplot()
    categories = ["overall", *sorted({c for run in runs for c in run.by_category} - {"overall"})]
    fig, ax = plt.subplots(figsize=(max(6.4, 0.9 * len(categories) * max(1, len(runs)) / 2), 4.2))
    width = 0.8 / len(runs)
    series = []
    for i, run in enumerate(runs):
        stats = {"overall": run.tau, **{c: v.tau for c, v in run.by_category.items()}}
        xs: list[float] = []
        ys: list[float] = []
        errs: list[list[float]] = [[], []]
        for j, name in enumerate(categories):
            tau = stats.get(name)
            if tau is None or tau.mean is None:
                continue
            xs.append(j + (i - (len(runs) - 1) / 2) * width)
            ys.append(tau.mean)
            _error_bar(errs, tau)
        ax.bar(xs, ys, width=width, yerr=errs, capsize=3, label=run_label(run))
        series.append(run_label(run))
    shown = {f"{run.dataset}_tau_t{run.temperature:g}" for run in runs}
    for row in report.reference or []:
        if row.reference is not None and row.key in shown:
            ax.axhline(row.reference, linestyle=":", color="black", linewidth=1)
            ax.annotate(
                f"reference {row.key} = {row.reference:g}",
                (len(categories) - 0.5, row.reference),
                ha="right",
                va="bottom",
                fontsize=7,
            )
            series.append(f"reference {row.key}")
    ax.set_xticks(range(len(categories)), categories, rotation=30, ha="right", fontsize=8)
    ax.set(ylabel="tau (tokens per verification step)", title="Acceptance length by category (95% CI)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    return _save(fig, path, "tau_by_category", series)


def plot_throughput(report: BenchSummary, path: Path) -> str | None:
    online = report.online
    if not online:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    series = []
    for name, runs, style in (("speculative", online.endpoint_runs, "-"), ("baseline", online.baseline_runs, "--")):
        if not runs:
            continue
        for temperature in sorted({lv.temperature for lv in runs.levels}):
            levels = sorted((lv for lv in runs.levels if lv.temperature == temperature), key=lambda lv: lv.concurrency)
            label = f"{name} T={temperature:g}"
            ax.plot(
                [lv.concurrency for lv in levels],
                [lv.output_tokens_per_second or 0 for lv in levels],
                marker="o",
                linestyle=style,
                label=label,
            )
            series.append(label)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="concurrent requests", ylabel="output tokens / s", title="Throughput vs concurrency")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path, "throughput_vs_concurrency", series)


def plot_confidence(report: BenchSummary, path: Path) -> str | None:
    sweep = report.offline.confidence_sweep if report.offline else []
    if not sweep:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    series = []
    for key in sorted({(r.dataset, r.temperature) for r in sweep}):
        rows = sorted((r for r in sweep if (r.dataset, r.temperature) == key), key=lambda r: r.threshold)
        label = f"{key[0]} T={key[1]:g}"
        xs, ys = [r.verified_per_step for r in rows], [r.tau for r in rows]
        ax.plot(xs, ys, marker="o", label=label)
        for r in rows:
            ax.annotate(
                f"{r.threshold:g}",
                (r.verified_per_step, r.tau),
                fontsize=7,
                textcoords="offset points",
                xytext=(3, 3),
            )
        series.append(label)
    ax.set(
        xlabel="tokens verified per step (target positions)",
        ylabel="tau (tokens per step)",
        title="Confidence-scheduled verification (labels: threshold)",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path, "confidence_tradeoff", series)


def plot_calibration(report: BenchSummary, path: Path) -> str | None:
    """Per run with a confidence head: the reliability diagram (pooled over positions) and, per draft
    position, the mean predicted survival against the observed acceptance rate."""
    runs = [r for r in (report.offline.runs if report.offline else []) if r.calibration]
    if not runs:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10.0, 4.2))
    left, right = axes
    left.plot([0, 1], [0, 1], linestyle=":", color="gray", linewidth=1)
    series = []
    for run in runs:
        cal, label = run.calibration, run_label(run)
        assert cal is not None
        bins = cal.overall.bins
        (line,) = left.plot(
            [b.predicted for b in bins],
            [b.observed for b in bins],
            marker="o",
            label=f"{label}: ECE {cal.overall.ece:.3f}, {cal.verdict}",
        )
        for b in bins:
            left.annotate(
                str(b.n),
                (b.predicted, b.observed),
                fontsize=6,
                textcoords="offset points",
                xytext=(3, -8),
                color=line.get_color(),
            )
        positions = [p for p in cal.positions if p.predicted_survival is not None]
        xs = [p.position for p in positions]
        right.plot(
            xs,
            [p.observed_acceptance for p in positions],
            marker="o",
            color=line.get_color(),
            label=f"{label} observed",
        )
        right.plot(
            xs,
            [p.predicted_survival for p in positions],
            marker="x",
            linestyle="--",
            color=line.get_color(),
            label=f"{label} predicted (survival)",
        )
        series.append(label)
    left.set(
        xlabel="predicted acceptance (confidence; bin mean)",
        ylabel="observed acceptance (slots reached)",
        xlim=(0, 1.02),
        ylim=(0, 1.02),
        title="Reliability diagram (labels: slots per bin)",
    )
    right.set(
        xlabel="draft position",
        ylabel="acceptance rate (per drafting step)",
        ylim=(0, 1.02),
        title="Per position: predicted vs observed",
    )
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, path, "calibration", series)


def plot_adaptive(report: BenchSummary, path: Path) -> str | None:
    """Modelled tokens per verification step and throughput against concurrency: fixed-k, adaptive, none."""
    model = report.offline.adaptive_verification if report.offline else None
    runs = [r for r in model.runs if r.levels] if model else []
    if not model or not runs:
        return None
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10.5, 4.3))
    series = []
    for run in runs:
        xs = [lv.concurrency for lv in run.levels]
        label = run_label(run)
        (line,) = left.plot(xs, [lv.fixed.tokens_per_step for lv in run.levels], marker="o", label=f"{label} fixed-k")
        left.plot(
            xs,
            [lv.adaptive.tokens_per_step for lv in run.levels],
            marker="s",
            linestyle="--",
            color=line.get_color(),
            label=f"{label} adaptive",
        )
        right.plot(
            xs,
            [lv.fixed.tokens_per_second for lv in run.levels],
            marker="o",
            color=line.get_color(),
            label=f"{label} fixed-k",
        )
        right.plot(
            xs,
            [lv.adaptive.tokens_per_second for lv in run.levels],
            marker="s",
            linestyle="--",
            color=line.get_color(),
            label=f"{label} adaptive",
        )
        series += [f"{label} fixed-k", f"{label} adaptive"]
    none = runs[0].levels
    right.plot(
        [lv.concurrency for lv in none],
        [lv.none.tokens_per_second for lv in none],
        color="black",
        linestyle=":",
        marker=".",
        label="no speculation",
    )
    series.append("no speculation")
    cost = model.cost_model
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    left.set(
        xlabel="concurrent requests",
        ylabel="tokens per verification step (per request)",
        title="Expected tokens per step",
        ylim=(0.9, None),
    )
    right.set(
        xlabel="concurrent requests", ylabel="modelled output tokens / s", yscale="log", title="Modelled throughput"
    )
    kind = "an ESTIMATE, not measured" if cost.estimate else "measured"
    fig.suptitle(
        f"vLLM adaptive verification vs fixed-k, modelled; cost model: {cost.label.split(':')[0]} ({kind})",
        fontsize=9,
    )
    return _save(fig, path, "adaptive_verification", series)


def _error_bar(errs: list[list[float]], tau: Estimate) -> None:
    """Append one bar's [below, above] from its 95% interval (0 where there is none: one turn)."""
    low, high = tau.ci95
    assert tau.mean is not None
    errs[0].append(tau.mean - low if low is not None else 0.0)
    errs[1].append(high - tau.mean if high is not None else 0.0)


def _tau_errors(bins: list[ContextBin]) -> list[list[float]]:
    """errorbar's [below, above] from each bin's 95% interval (0 where a bin has none: one turn)."""
    errs: list[list[float]] = [[], []]
    for b in bins:
        _error_bar(errs, b.tau)
    return errs


def plot_context(report: BenchSummary, path: Path) -> str | None:
    """tau against context length (bin middles, 95% intervals, turns per bin) for the sweep's long
    conversations and the main runs; beside it, the sweep's per-position acceptance in each bin."""
    offline = report.offline
    sweeps = [s for s in offline.context_sweep if s.bins] if offline else []
    runs = [(run_label(r), r.by_context) for r in offline.runs if r.by_context] if offline else []
    if not sweeps and not runs:
        return None
    plt = _pyplot()
    if sweeps:
        fig, (ax, right) = plt.subplots(1, 2, figsize=(11.0, 4.6), gridspec_kw={"width_ratios": [1.3, 1]})
    else:
        fig, ax = plt.subplots(figsize=(6.8, 4.4))
    series, edges = [], set()
    for sweep in sweeps:
        label = f"{run_label(sweep)} (sweep: {_count(sweep.num_conversations, 'conversation')})"
        bins = sweep.bins
        xs = [(b.low + b.high) / 2 for b in bins]
        line = ax.errorbar(xs, [b.tau.mean for b in bins], yerr=_tau_errors(bins), marker="o", capsize=3, label=label)
        for x, b in zip(xs, bins, strict=True):
            ax.annotate(
                _count(b.num_turns, "turn"),
                (x, b.tau.mean),
                fontsize=7,
                textcoords="offset points",
                xytext=(5, 4),
                color=line.lines[0].get_color(),
            )
        edges |= {b.high for b in bins}
        series.append(label)
    for i, (label, bins) in enumerate(runs):
        dodge = 2 ** (-0.1 * (i + 1)) if sweeps else 1.0  # left of the sweep's point of the same bin, not on it
        xs = [dodge * (b.low + b.high) / 2 for b in bins]
        ax.errorbar(
            xs,
            [b.tau.mean for b in bins],
            yerr=_tau_errors(bins),
            marker="s",
            capsize=3,
            linestyle="--",
            alpha=0.8,
            label=f"{label} (main run)",
        )
        edges |= {b.high for b in bins}
        series.append(label)
    max_len = max((s.max_model_len or 0 for s in sweeps), default=0)
    if max_len:
        ax.axvline(max_len, color="gray", linestyle=":", linewidth=1)
        ax.text(
            max_len,
            0.02,
            "max_model_len ",
            rotation=90,
            fontsize=7,
            color="gray",
            ha="right",
            va="bottom",
            transform=ax.get_xaxis_transform(),
        )
    ax.set_xscale("log", base=2)
    ticks = sorted(edges)
    ax.set_xticks(ticks, [str(t) for t in ticks], fontsize=8)
    ax.minorticks_off()
    ax.set_ylim(bottom=max(0.9, ax.get_ylim()[0]))
    ax.set(
        xlabel="tokens of context at the anchor (bin middles; ticks: bin edges)",
        ylabel="tau (tokens per verification step)",
        title="tau by context length (95% t intervals)",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    if sweeps:
        sweep = sweeps[0]
        colours = plt.get_cmap("viridis")
        for j, b in enumerate(sweep.bins):
            rates = b.acceptance_per_position
            right.plot(
                range(1, len(rates) + 1),
                rates,
                marker="o",
                color=colours(j / max(1, len(sweep.bins) - 1)),
                label=f"{b.low}-{b.high} ({_count(b.num_steps, 'step')})",
            )
        right.set(
            xlabel="draft position",
            ylabel="acceptance rate (per drafting step)",
            ylim=(0, 1.02),
            title=f"Per position, by context ({run_label(sweep)})",
        )
        right.grid(alpha=0.3)
        right.legend(fontsize=7, title="tokens of context", title_fontsize=7)
        fig.suptitle(_wrap(sweep.note, 140), fontsize=8)
    return _save(fig, path, "context_sweep", series)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


def _wrap(text: str, width: int) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width))


def plot_baselines(report: BenchSummary, path: Path) -> str | None:
    """The draft's tau beside the baselines' per temperature, with 95% intervals."""
    offline = report.offline
    if not offline or not offline.baselines:
        return None
    plt = _pyplot()
    runs = offline.runs
    bars = ["draft", *offline.baseline_names()]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    width = 0.8 / len(bars)
    for j, name in enumerate(bars):
        xs: list[float] = []
        ys: list[float] = []
        errs: list[list[float]] = [[], []]
        for i, run in enumerate(runs):
            baseline = None if name == "draft" else offline.baseline(name, run)
            tau = run.tau if name == "draft" else baseline.tau if baseline else None
            if tau is None or tau.mean is None:
                continue
            xs.append(i + (j - (len(bars) - 1) / 2) * width)
            ys.append(tau.mean)
            _error_bar(errs, tau)
        ax.bar(
            xs,
            ys,
            width=width,
            yerr=errs,
            capsize=3,
            label={"draft": "DSpark draft", "ngram": "n-gram (prompt lookup)", "untrained": "untrained draft"}.get(
                name, name
            ),
        )
    ax.axhline(1.0, color="black", linestyle=":", linewidth=1)
    ax.set_xticks(range(len(runs)), [run_label(r) for r in runs], fontsize=8)
    ax.set(ylabel="tau (tokens per verification step)", title="Draft vs baselines, same engine and prompts (95% CI)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    return _save(fig, path, "baselines", bars)


def draft_baseline_columns(drafts: list[DraftResults]) -> list[tuple[str, str, list[int]]]:
    """(column title, baseline name, which drafts' results it shows): a baseline is shown once when it gave
    the same numbers for every draft (`ngram`; `untrained` for drafts of one architecture), else per draft."""
    names = list(dict.fromkeys(n for d in drafts for n in d.offline.baseline_names()))
    columns = []
    for name in names:
        seen: dict[str, list[int]] = {}
        for i, draft in enumerate(drafts):
            found = [b.to_dict() for b in draft.offline.baselines if b.name == name]
            seen.setdefault(repr(found), []).append(i)
        title = BASELINE_TITLES.get(name, name)
        if len(seen) == 1:
            columns.append((title, name, [0]))
        else:
            columns += [(f"{title} ({drafts[i].name})", name, [i]) for group in seen.values() for i in group]
    return columns


BASELINE_TITLES = {"ngram": "n-gram (prompt lookup)", "untrained": "untrained draft"}


def plot_acceptance_drafts(report: BenchSummary, path: Path) -> str | None:
    """Several drafts: per-position acceptance of each draft on each dataset and temperature, one plot
    (a colour per draft, a marker and line style per dataset and temperature)."""
    drafts = report.drafts or []
    if not any(d.offline.runs for d in drafts):
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.8, 4.2))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = [("o", "-"), ("s", "--"), ("^", ":"), ("D", "-.")]
    keys = list(dict.fromkeys((r.dataset, r.temperature) for d in drafts for r in d.offline.runs))
    series = []
    for i, draft in enumerate(drafts):
        for run in draft.offline.runs:
            marker, line = styles[keys.index((run.dataset, run.temperature)) % len(styles)]
            rates = [p.mean for p in run.acceptance_per_position]
            label = f"{draft.name} {run_label(run)}"
            ax.plot(
                range(1, len(rates) + 1),
                rates,
                marker=marker,
                linestyle=line,
                color=colours[i % len(colours)],
                label=label,
            )
            series.append(label)
    ax.set(
        xlabel="draft position",
        ylabel="acceptance rate (per drafting step)",
        ylim=(0, 1.02),
        title="Per-position acceptance, drafts compared",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path, "acceptance_per_position", series)


def plot_tau_drafts(report: BenchSummary, path: Path) -> str | None:
    """Several drafts: each draft's tau per dataset and temperature (95% intervals), the baselines beside."""
    drafts = report.drafts or []
    runs = drafts[0].offline.runs if drafts else []
    if not runs:
        return None
    plt = _pyplot()
    bars: list[tuple[str, Any]] = [(d.name, d) for d in drafts]
    bars += [(title, (name, index)) for title, name, (index, *_) in draft_baseline_columns(drafts)]
    fig, ax = plt.subplots(figsize=(max(6.4, 1.2 * len(runs) * len(bars) / 2), 4.2))
    width = 0.8 / len(bars)
    for j, (label, what) in enumerate(bars):
        xs: list[float] = []
        ys: list[float] = []
        errs: list[list[float]] = [[], []]
        for i, run in enumerate(runs):
            if isinstance(what, tuple):
                found = drafts[what[1]].offline.baseline(what[0], run)
                tau = found.tau if found else None
            else:
                match = next(
                    (r for r in what.offline.runs if (r.dataset, r.temperature) == (run.dataset, run.temperature)), None
                )
                tau = match.tau if match else None
            if tau is None or tau.mean is None:
                continue
            xs.append(i + (j - (len(bars) - 1) / 2) * width)
            ys.append(tau.mean)
            _error_bar(errs, tau)
        ax.bar(xs, ys, width=width, yerr=errs, capsize=3, label=label, hatch="//" if isinstance(what, tuple) else None)
    ax.axhline(1.0, color="black", linestyle=":", linewidth=1)
    ax.set_xticks(range(len(runs)), [run_label(r) for r in runs], fontsize=8)
    ax.set(ylabel="tau (tokens per verification step)", title="Drafts compared, same engine and prompts (95% CI)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    return _save(fig, path, "tau_by_draft", [label for label, _ in bars])


def write_plots(report: BenchSummary, out_dir: Path) -> dict[str, str]:
    out_dir.mkdir(parents=True, exist_ok=True)
    if report.drafts is not None:
        several = {
            "acceptance_per_position": plot_acceptance_drafts(report, out_dir / "acceptance_per_position.png"),
            "tau_by_draft": plot_tau_drafts(report, out_dir / "tau_by_draft.png"),
        }
        return {k: v for k, v in several.items() if v is not None}
    made = {
        "acceptance_per_position": plot_acceptance(report, out_dir / "acceptance_per_position.png"),
        "tau_by_category": plot_tau_by_category(report, out_dir / "tau_by_category.png"),
        "throughput_vs_concurrency": plot_throughput(report, out_dir / "throughput_vs_concurrency.png"),
        "confidence_tradeoff": plot_confidence(report, out_dir / "confidence_tradeoff.png"),
        "calibration": plot_calibration(report, out_dir / "calibration.png"),
        "baselines": plot_baselines(report, out_dir / "baselines.png"),
        "adaptive_verification": plot_adaptive(report, out_dir / "adaptive_verification.png"),
        "context_sweep": plot_context(report, out_dir / "context_sweep.png"),
    }
    return {k: v for k, v in made.items() if v is not None}
