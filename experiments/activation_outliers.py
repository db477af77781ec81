"""How far the inputs of each transformer layer's feed-forward projections reach beyond their typical size: the
largest absolute value over the mean absolute value, per layer, on the int8 check's probe texts. Dynamic int8
quantisation gives each activation tensor one scale, set by its largest value, so a tensor whose peak is hundreds of
times its mean loses the values near the mean (all-mpnet-base-v2's feed-forward outputs; index/onnx/export.py keeps
those projections in fp32 where the check asks for it).

    python experiments/activation_outliers.py --model mpnet --model minilm

Results: docs/experiments/speed.md, "int8 graphs checked against their fp32 source (issue 56): all-mpnet-base-v2 on
ONNX Runtime int8".
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from medfaq.common.runtime import MedfaqError, resolve_model
from medfaq.eval.script_args import print_report

PROJECTIONS = {"feed-forward input": "intermediate", "feed-forward output": "output"}
"""Row name -> the BERT-family layer module whose ``dense`` projection's input is measured."""


def peak_over_mean(model: str) -> dict[str, list[float]]:
    """Per row of :data:`PROJECTIONS`, each encoder layer's max |x| / mean |x| of that projection's input."""
    import torch
    from sentence_transformers import SentenceTransformer

    from medfaq.index.onnx.check import probe_texts

    encoder = SentenceTransformer(resolve_model(model), device="cpu")
    layers = getattr(getattr(encoder[0].auto_model, "encoder", None), "layer", None)
    if layers is None:
        raise MedfaqError(f"{model} has no BERT-style encoder layers to measure")
    ratios: dict[str, list[float]] = {row: [0.0] * len(layers) for row in PROJECTIONS}

    def record(row: str, index: int) -> Any:
        def hook(_module: Any, inputs: tuple[torch.Tensor, ...], _output: Any) -> None:
            values = inputs[0].detach().abs()
            ratios[row][index] = max(ratios[row][index], float(values.max() / values.mean()))

        return hook

    for index, layer in enumerate(layers):
        for row, name in PROJECTIONS.items():
            getattr(layer, name).dense.register_forward_hook(record(row, index))
    with torch.no_grad():
        encoder.encode(probe_texts(), batch_size=len(probe_texts()))
    return ratios


def main(argv: Sequence[str] | None = None) -> int:
    program = "python experiments/activation_outliers.py"
    parser = argparse.ArgumentParser(prog=program, description=__doc__.split("\n")[0])
    parser.add_argument("--model", action="append", required=True, help="Encoder name or directory (repeatable).")
    parser.add_argument("--out", type=Path, default=None, help="Also write the JSON report here.")
    args = parser.parse_args(argv)
    try:
        report = {model: peak_over_mean(model) for model in args.model}
    except MedfaqError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    lines = ["| model | projection input | max/mean per layer |", "|---|---|---|"]
    for model, rows in report.items():
        lines += [f"| {model} | {row} | {' '.join(f'{r:.0f}' for r in ratios)} |" for row, ratios in rows.items()]
    print("\n".join(lines))
    print_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
