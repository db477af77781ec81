"""Figures for docs/results.md: cosine similarity of CHQ anchors to their hard and simple negatives per epoch.

``python experiments/plots.py runs/ecl-s0/history.json runs/ecl-s1/history.json --out docs/figures/ecl_cos.png``

Results: docs/experiments/summarizer.md, "Summarizer (MeQSum test)" (docs/figures/ecl_negative_similarity.png).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from medfaq.common.runtime import MedfaqError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

SERIES = {"train_cos_hard": "hard negatives (entity swaps)", "train_cos_simple": "simple negatives (queue)"}


def _main_stage(history_file: Path) -> list[dict]:
    if not Path(history_file).is_file():
        raise MedfaqError(f"history file {history_file} not found")
    return [h for h in json.loads(Path(history_file).read_text(encoding="utf-8")) if h.get("stage") == "main"]


def pyplot() -> ModuleType:
    """matplotlib's pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Figure, out_png: Path) -> Path:
    """Write the figure to `out_png` (its folder created) and free it."""
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png)
    pyplot().close(fig)
    return out_png


def negative_similarity_plot(history_files: Sequence[Path], out_png: Path, title: str = "") -> Path:
    """Plot mean cos(CHQ anchor, negative) per training epoch from trainers' ``history.json`` files (ECL Fig. 4).

    With several runs (seeds), each series is the mean over the runs that reached the epoch, with its min-max band.
    """
    plt = pyplot()
    histories = [_main_stage(Path(path)) for path in history_files]
    fig, ax = plt.subplots(figsize=(5, 3.4), dpi=150)
    plotted = False
    for key, label in SERIES.items():
        by_epoch: dict[int, list[float]] = {}
        for history in histories:
            for record in history:
                if record.get(key) is not None:
                    by_epoch.setdefault(record["epoch"], []).append(record[key])
        if not by_epoch:
            continue
        epochs = sorted(by_epoch)
        values = [np.asarray(by_epoch[epoch]) for epoch in epochs]
        line = ax.plot(epochs, [v.mean() for v in values], marker="o", label=label)[0]
        if len(histories) > 1:
            lows, highs = [v.min() for v in values], [v.max() for v in values]
            ax.fill_between(epochs, lows, highs, color=line.get_color(), alpha=0.2, linewidth=0)
        plotted = True
    if not plotted:
        plt.close(fig)
        raise MedfaqError("the history files have no anchor/negative similarities (train an ECL variant)")
    ax.set_xlabel("epoch")
    ax.set_ylabel("mean cosine similarity to the CHQ")
    runs = f"\n(mean of {len(histories)} runs, min-max band)" if len(histories) > 1 else ""
    ax.set_title(title or f"CHQ vs. negatives during ECL training{runs}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, out_png)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python experiments/plots.py", description="Plot CHQ-to-negative cosine similarity per epoch (ECL Fig. 4)."
    )
    parser.add_argument("histories", nargs="+", type=Path, help="history.json files of ECL-family runs")
    parser.add_argument("--out", type=Path, required=True, help="PNG to write")
    parser.add_argument("--title", default="", help="figure title")
    args = parser.parse_args(argv)
    try:
        print(negative_similarity_plot(args.histories, args.out, args.title))
    except MedfaqError as error:
        parser.exit(2, f"error: {error}\n")


if __name__ == "__main__":
    main()
