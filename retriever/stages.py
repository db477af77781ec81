"""The real pipeline stages, registered with :func:`retriever.pipeline.register_stage_loader` on import.

* ``rewrite``: :class:`summarizer.generation.Summarizer` (default model ``summarizer-ecl-quick`` under
  ``$MEDFAQ_HOME/models``), generating with the config's beams and maximum length;
* ``rerank``: :class:`retriever.crossencoder.CrossEncoderReranker` (default ``reranker-faq-quick``);
* ``entities``: :func:`summarizer.entities.load_recognizer` (stanza when its models are on disk, else the
  offline dictionaries).

With ``quantize`` in the config, the summarizer's and the reranker's linear layers are converted to int8 with
PyTorch dynamic quantisation (CPU only, `index.runtime.quantize_linear`).
Import this module (the CLI does) before :meth:`Pipeline.from_config`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from retriever.pipeline import PipelineConfig, register_stage_loader

DEFAULT_SUMMARIZER = "summarizer-ecl-quick"
DEFAULT_RERANKER = "reranker-faq-quick"


class SummarizerRewriter:
    """The :class:`~retriever.pipeline.QueryRewriter` over a Summarizer, with fixed generation settings (None = the
    beams and length the summarizer was validated with)."""

    def __init__(self, summarizer: Any, num_beams: int | None = None, max_length: int | None = None) -> None:
        self.summarizer = summarizer
        self.num_beams = num_beams or summarizer.num_beams
        self.max_length = max_length or summarizer.max_length

    def rewrite(self, texts: list[str]) -> list[str]:
        return self.summarizer.summarize(list(texts), num_beams=self.num_beams, max_length=self.max_length)


def load_rewriter(name: str | None, config: PipelineConfig) -> SummarizerRewriter:
    from summarizer.generation import Summarizer

    summarizer = Summarizer.load(name or DEFAULT_SUMMARIZER, quantize=config.quantize)
    return SummarizerRewriter(summarizer, config.summary_beams, config.summary_max_length)


def load_reranker(name: str | None, config: PipelineConfig) -> Any:
    from index.runtime import MedfaqError, resolve_model
    from retriever.crossencoder import CrossEncoderReranker, has_classifier_head

    path = Path(resolve_model(name or DEFAULT_RERANKER))
    if path.is_dir() and not (path / "config.json").is_file():
        raise MedfaqError(f"reranker {path} is not a model directory (no config.json)")
    if path.is_dir() and not has_classifier_head(str(path)):
        raise MedfaqError(
            f"reranker {path} has no classification head (a bi-encoder or plain encoder?); "
            "pass a cross-encoder, e.g. one trained with `medfaq train crossencoder --task faq`"
        )
    return CrossEncoderReranker.load(name or DEFAULT_RERANKER, quantize=config.quantize)


def load_entities(name: str | None) -> Any:
    from summarizer.entities import load_recognizer

    return load_recognizer(name or "auto")


register_stage_loader("rewrite", load_rewriter, takes_config=True)
register_stage_loader("rerank", load_reranker, takes_config=True)
register_stage_loader("entities", load_entities)
