"""The pipeline stages' loaders, declared in one registry (:data:`STAGE_LOADERS`) that the stage cache
(:mod:`retriever.model_cache`) imports: every process that builds a pipeline has all of them.

* ``rewrite``: :class:`summarizer.generation.Summarizer` (default: the best summarizer `medfaq setup` trained
  under ``$MEDFAQ_HOME/models``, see :mod:`retriever.trained_models`), generating with the config's beams and length;
* ``rerank``: the cross-encoder (default: the one `medfaq setup` trains) on the runtime :func:`rerank_backend`
  picks: :class:`retriever.reranker.onnx.OnnxReranker` (ONNX Runtime, no torch) or
  :class:`retriever.reranker.model.CrossEncoderReranker` (PyTorch);
* ``likelihood``: :class:`summarizer.likelihood.SummaryLikelihood` over the same summarizer as ``rewrite``: how
  likely it finds each candidate FAQ question given the consumer question;
* ``entities``: :func:`summarizer.entities.load_recognizer` (stanza when its models are on disk, else the
  offline dictionaries).

Each loader declares the config fields it reads (the stage cache keys the stage by them) and locates its model
first: a set-up model that is not trained yet raises `ModelNotTrained`, which the command line turns into an offer
to train it there and then (`medfaq --yes ...`), and anything else into one line naming the train command.

With ``quantize`` in the config, the summarizer's and the reranker's linear layers are converted to int8 with
PyTorch dynamic quantisation (CPU only, `common.runtime.quantize_linear`); an ONNX reranker runs its int8 graph.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from medfaq.common.model_kinds import SUMMARIZER, check_model_kind
from medfaq.common.runtime import resolve_model
from medfaq.retriever.reranker.base import trained_crossencoder
from medfaq.retriever.trained_models import RERANKER_MODEL, SUMMARIZER_ECL_MODEL, best_summarizer, require_trained

DEFAULT_RERANKER = RERANKER_MODEL


@dataclass(frozen=True)
class StageLoader:
    """How a stage kind is built: ``load(model, settings)`` returns the stage object (``load(model)`` when it `reads`
    no setting); `reads`: the :class:`PipelineConfig` fields it reads, handed to it as `settings`;
    ``locate(name)``: the model the configured `name` means (None = the default), resolved, or a one-line
    :class:`MedfaqError` naming the fix; without it `model` is `name` as configured."""

    load: Callable[..., Any]
    reads: tuple[str, ...] = ()
    locate: Callable[[str | None], str | None] | None = None


class StageSettings:
    """The config fields a stage loader declared it reads, as attributes; reading another one is an error (a value
    the stage depends on would be missing from its cache key)."""

    def __init__(self, kind: str, values: dict[str, Any]) -> None:
        self._kind, self._values = kind, values

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("_values", {})
        if name not in values:
            raise AttributeError(f"the {self._kind} stage loader reads {name!r} without declaring it in `reads`")
        return values[name]


def set_up_model(name: str | None, kind: str, default: str | None) -> str:
    """`name` (or `default`), with a one-line error naming the fix when it is a set-up model not trained yet."""
    chosen = name or default or SUMMARIZER_ECL_MODEL
    require_trained(chosen, kind)
    return chosen


class SummarizerRewriter:
    """The :class:`~retriever.pipeline.QueryRewriter` over a Summarizer, with fixed generation settings (None = the
    beams and length the summarizer was validated with)."""

    def __init__(self, summarizer: Any, num_beams: int | None = None, max_length: int | None = None) -> None:
        self.summarizer = summarizer
        validated = summarizer.decoding
        self.decoding = replace(
            validated, num_beams=num_beams or validated.num_beams, max_length=max_length or validated.max_length
        )

    def rewrite(self, texts: list[str]) -> list[str]:
        return self.summarizer.summarize(list(texts), self.decoding)


def locate_summarizer(name: str | None) -> str:
    """The summarizer directory `name` means (None: the best one trained under the models directory); a model of
    another kind fails here, before the model libraries load."""
    location = resolve_model(set_up_model(name, "summarizer", best_summarizer()))
    check_model_kind(location, SUMMARIZER, location)
    return location


def load_rewriter(model: str, settings: StageSettings) -> SummarizerRewriter:
    from medfaq.summarizer.generation import Summarizer

    summarizer = Summarizer.load(model, quantize=settings.quantize)
    return SummarizerRewriter(summarizer, settings.summary_beams, settings.summary_max_length)


def load_likelihood(model: str, settings: StageSettings) -> Any:
    from medfaq.summarizer.likelihood import SummaryLikelihood

    return SummaryLikelihood.load(
        model,
        quantize=settings.quantize,
        vocabulary=settings.likelihood_vocabulary,
        precision=settings.likelihood_precision,
    )


def locate_reranker(name: str | None) -> str:
    """The cross-encoder `name` means (None: the one `medfaq setup` trains); a wrong name or path fails here,
    before the model libraries load."""
    return str(trained_crossencoder(set_up_model(name, "reranker", DEFAULT_RERANKER)))


def load_reranker(model: str, settings: StageSettings) -> Any:
    if rerank_backend(settings) == "onnx":
        from medfaq.retriever.reranker.onnx import OnnxReranker

        return OnnxReranker.load(model, quantize=settings.quantize, max_length=settings.rerank_max_length)
    from medfaq.retriever.reranker.model import CrossEncoderReranker

    return CrossEncoderReranker.load(
        model, quantize=settings.quantize, max_length=settings.rerank_max_length, precision=settings.rerank_precision
    )


def rerank_backend(config: StageSettings) -> str:
    """``onnx`` or ``torch``: the reranker runs where the query encoder does (`config.encoder_backend`, ``auto``:
    ONNX Runtime on the CPU), on PyTorch when its products are asked in bf16 (`config.rerank_precision`)."""
    from medfaq.index.encoder import resolve_backend

    if config.rerank_precision != "fp32":
        return "torch"
    return "torch" if resolve_backend(config.encoder_backend) == "torch" else "onnx"


def load_entities(name: str | None) -> Any:
    from medfaq.summarizer.entities import load_recognizer

    return load_recognizer(name or "auto")


STAGE_LOADERS: dict[str, StageLoader] = {
    "rewrite": StageLoader(
        load_rewriter, reads=("quantize", "summary_beams", "summary_max_length"), locate=locate_summarizer
    ),
    "rerank": StageLoader(
        load_reranker,
        reads=("quantize", "rerank_max_length", "rerank_precision", "encoder_backend"),
        locate=locate_reranker,
    ),
    "likelihood": StageLoader(
        load_likelihood,
        reads=("quantize", "likelihood_vocabulary", "likelihood_precision"),
        locate=locate_summarizer,
    ),
    "entities": StageLoader(load_entities),
}
"""The loader of each stage kind (:data:`retriever.pipeline.STAGE_KINDS`)."""
