"""fp32 against bf16 (torch autocast) on this CPU: seconds per training step and per inference batch of the models
medfaq trains, and what ``--precision auto`` picks here.

    python experiments/precision_speed.py --models minilm,gemma-3-270m --threads 1 --out precision.json

A training step is what the trainers do (forward, backward, AdamW step; Gemma with its embedding frozen and
LM-head logits at the target positions only); inference is one forward pass of the same batch. Inputs are random
token ids of fixed length, so only the arithmetic is compared; the quality of bf16 training is measured by the
training commands themselves (docs/results.md).

Results: docs/experiments/setup.md, "bf16 training on CPUs with AMX (`--precision auto|fp32|bf16`)".
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from medfaq.common.runtime import autocast, resolve_precision
from medfaq.eval.script_args import positive_int, report_or_error


def median_seconds(run: Callable[[], None], repeats: int, warmup: int = 2) -> float:
    """Median wall seconds of `repeats` calls of `run` after `warmup` untimed ones."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


Step = Callable[[], None]


def model_steps(name: str, batch: int, tokens: int) -> tuple[Callable[[str], Step], Callable[[str], Step]]:
    """(training step, inference pass) makers for `name` on a random batch, each taking the precision: an encoder
    (``minilm``, ``mpnet``, any BERT-like path) reads (batch, tokens) ids; a causal LM (``gemma-3-270m``) reads them
    as prompt + target, the last quarter being the target."""
    import torch

    from medfaq.summarizer.modeling import backbone_is_causal, load_backbone

    torch.manual_seed(0)
    ids = torch.randint(1000, 20000, (batch, tokens))
    if backbone_is_causal(name):
        model, _ = load_backbone(name)
        model.get_input_embeddings().requires_grad_(False)
        targets = torch.zeros_like(ids, dtype=torch.bool)
        targets[:, -tokens // 4 :] = True

        def loss() -> torch.Tensor:
            hidden = model.model(input_ids=ids).last_hidden_state
            logits = model.get_output_embeddings()(hidden[:, :-1][targets[:, 1:]]).float()
            return torch.nn.functional.cross_entropy(logits, ids[:, 1:][targets[:, 1:]])
    else:
        from transformers import AutoModel

        from medfaq.common.runtime import resolve_model

        model = AutoModel.from_pretrained(resolve_model(name))

        def loss() -> torch.Tensor:
            return model(input_ids=ids).last_hidden_state.float().pow(2).mean()

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)

    def train_step(precision: str) -> Step:
        def step() -> None:
            model.train()
            with autocast(precision):
                value = loss()
            value.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return step

    def inference(precision: str) -> Step:
        def run() -> None:
            model.eval()
            with torch.inference_mode(), autocast(precision):
                model(input_ids=ids)

        return run

    return train_step, inference


def measure(args: argparse.Namespace) -> dict:
    """The report: per model, the median seconds of a training step and of inference in fp32 and bf16."""
    import torch

    torch.set_num_threads(args.threads)
    report: dict = {"threads": args.threads, "batch": args.batch, "tokens": args.tokens}
    report["auto"] = resolve_precision("auto")
    rows = {}
    for name in args.models.split(","):
        train_step, inference = model_steps(name, args.batch, args.tokens)
        row = {}
        for precision in ("fp32", "bf16"):
            row[f"train_step_s_{precision}"] = median_seconds(train_step(precision), args.repeats)
            row[f"inference_s_{precision}"] = median_seconds(inference(precision), args.repeats)
        row["train_speedup"] = row["train_step_s_fp32"] / row["train_step_s_bf16"]
        row["inference_speedup"] = row["inference_s_fp32"] / row["inference_s_bf16"]
        rows[name] = row
    report["rows"] = rows
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python experiments/precision_speed.py", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="minilm,gemma-3-270m", help="Comma-separated model names or paths.")
    parser.add_argument("--batch", type=positive_int, default=8)
    parser.add_argument("--tokens", type=positive_int, default=128)
    parser.add_argument("--repeats", type=positive_int, default=5)
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    return report_or_error(lambda: measure(args), args.out)


if __name__ == "__main__":
    sys.exit(main())
