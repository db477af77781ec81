"""Weight averaging ("model soup") of summarizers trained by one recipe with different seeds.

Runs fine-tuned from the same pretrained weights stay close enough in weight space that their average is a model of
its own: it generates exactly as fast as each run and, for Gemma 3 270M, scores above the runs' mean
(docs/results.md). The MiniLM encoder-decoder starts its cross-attention from seed-dependent random weights, so its
runs share no starting point and are refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import torch

from medfaq.common.model_kinds import QUESTION_WRITER, SUMMARIZER, check_model_kind
from medfaq.common.runtime import MedfaqError, make_once, resolve_model
from medfaq.summarizer.modeling import load_backbone
from medfaq.summarizer.training.config import CONFIG_FILE, SummarizerTrainConfig

# settings averaged runs may differ in: the seed, where and how they ran, checkpointing, and validation (which only
# decides the epoch a run's best model holds and when it stops early)
FREE_SETTINGS = {"seed", "device", "threads", "precision", "save_every_steps", "max_steps", "eval_examples", "patience"}


def _config(path: Path) -> SummarizerTrainConfig:
    check_model_kind(path, (SUMMARIZER, QUESTION_WRITER), path)
    if not (path / CONFIG_FILE).is_file():
        raise MedfaqError(f"{path} is not a trained summarizer (no {CONFIG_FILE})")
    return SummarizerTrainConfig.load(path)


def _setting(config: SummarizerTrainConfig, name: str) -> object:
    """A recipe setting as averaging compares it: the mined retrieval negatives by what their file holds (each run
    saves its own copy beside its model), every other setting as it is."""
    value = getattr(config, name)
    if name == "retrieval_negatives" and value and Path(value).is_file():
        return Path(value).read_bytes()
    return value


def average_summarizers(runs: Sequence[str | Path], out: str | Path) -> Path:
    """Write the parameter-wise mean of `runs` (trained summarizer directories of one recipe) into `out`."""
    if len(runs) < 2:
        raise MedfaqError("averaging needs at least two trained summarizers")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise MedfaqError(f"{out} is not an empty directory; choose another --out")
    paths = [Path(resolve_model(run)) for run in runs]
    configs = [_config(path) for path in paths]
    differing = sorted(
        f.name
        for f in dataclasses.fields(SummarizerTrainConfig)
        if f.name not in FREE_SETTINGS and any(_setting(c, f.name) != _setting(configs[0], f.name) for c in configs)
    )
    if differing:
        raise MedfaqError(f"the runs differ in {', '.join(differing)}; average runs of one recipe and other seeds")
    model, tokenizer = load_backbone(paths[0])
    if model.config.model_type == "encoder-decoder":
        raise MedfaqError(
            "warm-started encoder-decoders (the MiniLM backbone) start their cross-attention from the seed; "
            "only runs fine-tuned from the same pretrained weights can be averaged"
        )
    parameters = dict(model.named_parameters())  # tied weights appear once
    totals = {name: parameter.detach().double() for name, parameter in parameters.items()}
    for path in paths[1:]:
        other = dict(load_backbone(path)[0].named_parameters())
        if other.keys() != totals.keys() or any(other[k].shape != total.shape for k, total in totals.items()):
            raise MedfaqError(f"{path} has other parameters than {paths[0]}; average runs of one backbone")
        for name, total in totals.items():
            total += other[name].detach().double()
    with torch.no_grad():
        for name, parameter in parameters.items():
            parameter.copy_(totals[name] / len(paths))

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        dataclasses.replace(configs[0], averaged_from=[str(path) for path in paths]).save(tmp)

    return make_once(out, CONFIG_FILE, write)
