"""Figures for docs/results.md: cosine similarity of CHQ anchors to their hard and simple negatives per epoch."""

from __future__ import annotations

import json
from pathlib import Path

from index.runtime import MedfaqError

SERIES = {"train_cos_hard": "hard negatives (entity swaps)", "train_cos_simple": "simple negatives (queue)"}


def negative_similarity_plot(history_file: Path, out_png: Path, title: str = "") -> Path:
    """Plot mean cos(CHQ anchor, negative) per training epoch from a trainer's ``history.json`` (ECL Fig. 4)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not Path(history_file).is_file():
        raise MedfaqError(f"history file {history_file} not found")
    history = [h for h in json.loads(Path(history_file).read_text(encoding="utf-8")) if h.get("stage") == "main"]
    fig, ax = plt.subplots(figsize=(5, 3.4), dpi=150)
    plotted = False
    for key, label in SERIES.items():
        points = [(h["epoch"], h[key]) for h in history if h.get(key) is not None]
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", label=label)
            plotted = True
    if not plotted:
        plt.close(fig)
        raise MedfaqError(f"{history_file} has no anchor/negative similarities (train an ECL variant)")
    ax.set_xlabel("epoch")
    ax.set_ylabel("mean cosine similarity to the CHQ")
    ax.set_title(title or "CHQ vs. negatives during ECL training", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png)
    plt.close(fig)
    return out_png
