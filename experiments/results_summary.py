"""The figure of the summary at the top of docs/results.md, drawn from the numbers in docs/results/summary.json, and
the default pipeline's numbers as text. Both report the benchmarks by kind (index/datasets.py): the real FAQ banks,
the evidence for defaults, first; the summary-matching sets apart, after them.

``python experiments/results_summary.py docs/results/summary.json --out docs/figures/results_summary.png``

Results: docs/results.md, "The figure" (docs/figures/results_summary.png).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from medfaq.common.runtime import MedfaqError
from medfaq.eval.benchmarks import by_kind, kind_heading

if __package__:  # imported as `experiments.results_summary`
    from .plots import pyplot, save_figure
else:  # run as `python experiments/results_summary.py`, its folder first on sys.path
    from plots import pyplot, save_figure


def _bars(ax, labels: Sequence[str], series: dict[str, Sequence[float | None]], value_format: str) -> None:
    """Grouped vertical bars, one group per label, each bar annotated with its value; a missing value is `n/a`."""
    width = 0.8 / len(series)
    positions = np.arange(len(labels))
    for i, (name, values) in enumerate(series.items()):
        offsets = positions + (i - (len(series) - 1) / 2) * width
        heights = [0.0 if value is None else value for value in values]
        bars = ax.bar(offsets, heights, width, label=name)
        texts = ["n/a" if value is None else format(value, value_format) for value in values]
        ax.bar_label(bars, labels=texts, fontsize=6.5, padding=1.5)
    ax.set_xticks(positions, labels, fontsize=7.5, rotation=20, ha="right")
    ax.tick_params(axis="y", labelsize=7.5)
    ax.grid(axis="y", alpha=0.3)
    ax.axhline(0, color="black", linewidth=0.6)
    ax.margins(y=0.18)


def _mark_kinds(ax, groups: list[tuple[str, list[str]]]) -> None:
    """A dashed line between the groups of bars of each benchmark kind, and the kind's name above its group."""
    start = 0
    for i, (kind, names) in enumerate(groups):
        if i:
            ax.axvline(start - 0.5, color="grey", linestyle="--", linewidth=0.8)
        transform = ax.get_xaxis_transform()
        ax.text(start + (len(names) - 1) / 2, 1.01, kind or "other", transform=transform, ha="center", fontsize=7)
        start += len(names)


def read_summary(summary_file: Path) -> dict:
    if not Path(summary_file).is_file():
        raise MedfaqError(f"summary file {summary_file} not found")
    return json.loads(Path(summary_file).read_text(encoding="utf-8"))


def format_summary(summary_file: Path) -> str:
    """The default pipeline's R@1 and MRR@10 per benchmark, under the heading of each kind, real FAQ banks first."""
    benchmarks = read_summary(summary_file)["default_pipeline"]["benchmarks"]
    lines = []
    for kind, names in by_kind(benchmarks):
        lines.append(f"== {kind_heading(kind)} ==")
        lines.append(f"{'benchmark':<14} {'questions':>9} {'R@1':>6} {'MRR@10':>7}")
        for name in names:
            row = benchmarks[name]
            lines.append(f"{name:<14} {row['questions']:>9} {row['R@1']:>6.1f} {row['MRR@10']:>7.1f}")
    return "\n".join(lines) + "\n"


def results_summary_plot(summary_file: Path, out_png: Path) -> Path:
    """Left: the default pipeline's R@1 and MRR@10 per benchmark; then each learned stage's R@1 change per benchmark;
    in every panel the real FAQ banks first, apart from the summary-matching sets."""
    summary = read_summary(summary_file)
    benchmarks = summary["default_pipeline"]["benchmarks"]
    groups = by_kind(benchmarks)
    names = [name for _, members in groups for name in members]
    stages = summary["stage_gains"]["stages"]
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(10, 6.4), dpi=150)
    default_ax, encoder_ax, summarizer_ax, rerank_ax = axes.flat
    _bars(
        default_ax,
        names,
        {metric: [benchmarks[name][metric] for name in names] for metric in ("R@1", "MRR@10")},
        ".1f",
    )
    default_ax.set_title("The default pipeline (dense, fine-tuned MPNet), %", fontsize=9, pad=12)
    default_ax.set_ylim(0, 122)
    default_ax.legend(fontsize=7, loc="upper center", ncol=2)
    panels = [
        (
            encoder_ax,
            [
                "MPNet fine-tuning over stock MPNet",
                "fine-tuned MPNet in place of fine-tuned MiniLM",
                "bi-encoder fine-tuning + synonyms",
            ],
            "The encoder",
        ),
        (summarizer_ax, ["summarizer: search with the summary", "summarizer: question + summary (RRF)"], "Summarizer"),
        (
            rerank_ax,
            ["reranker (3-seed mean)", "reranker correcting fine-tuned MPNet", "likelihood stage (gated)"],
            "Reranker and likelihood stage",
        ),
    ]
    for ax, stage_names, title in panels:
        _bars(ax, names, {stage: [stages[stage]["delta"][name] for name in names] for stage in stage_names}, "+.1f")
        ax.set_title(f"{title}: R@1 change, points", fontsize=9, pad=12)
        if len(stage_names) > 1:
            ax.legend(fontsize=7, loc="upper right" if ax is encoder_ax else "lower left")
    for ax in axes.flat:
        _mark_kinds(ax, groups)
    fig.suptitle("; ".join(kind_heading(kind) for kind, _ in groups), fontsize=8)
    return save_figure(fig, out_png)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python experiments/results_summary.py", description="Plot the summary numbers of docs/results.md."
    )
    parser.add_argument("summary", type=Path, help="the summary JSON (docs/results/summary.json)")
    parser.add_argument("--out", type=Path, required=True, help="PNG to write")
    args = parser.parse_args(argv)
    try:
        print(format_summary(args.summary), end="")
        print(results_summary_plot(args.summary, args.out))
    except MedfaqError as error:
        parser.exit(2, f"error: {error}\n")


if __name__ == "__main__":
    main()
