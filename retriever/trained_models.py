"""The models and indexes `medfaq setup` saves under ``$MEDFAQ_HOME``, by name, and what the search path asks of
them: which are trained, the best of each kind, and the one-line refusal (:class:`ModelNotTrained`) of a set-up
model not trained yet. How each is trained, and in how long, is the set-up recipe's (`app.setup_plan`), which the
search path never imports: the command line catches :class:`ModelNotTrained` and offers to train the model there.
"""

from __future__ import annotations

from pathlib import Path

from medfaq.common.runtime import UNFINISHED_FILE, MedfaqError, indexes_dir, models_dir, resolve_model
from medfaq.retriever.decisions.encoder_rule import stock_encoder

FAQ_INDEX = "medquad-faq"  # the MedQuAD index encoded by the fine-tuned retrieval bi-encoder (under indexes_dir())
STOCK_INDEX = "medquad-minilm"  # the MedQuAD index encoded by stock MiniLM: search works before any training
BIENCODER_MODEL = "biencoder-faq-quick"  # the fine-tuned MiniLM: the reranker's start and prior, `--fast`'s encoder
MPNET_BIENCODER_MODEL = "biencoder-mpnet-faq-quick"  # fine-tuned MPNet: the default retrieval encoder, FAQ_INDEX's
SUMMARIZER_ECL_MODEL = "summarizer-ecl-quick"  # the MiniLM ECL question summarizer
RERANKER_MODEL = "reranker-correction-quick"  # the FAQ reranker, a correction of the index's bi-encoder
SUMMARIZER_GEMMA_MODEL = "summarizer-gemma-quick"  # the Gemma 3 270M question summarizer
QUESTION_WRITER_MODEL = "question-writer"  # FAQ -> consumer questions, for `medfaq index adapt`
SUMMARIZER_RANK_MODEL = "summarizer-gemma-rank"  # the Gemma summarizer trained to rank the MedQuAD bank
SET_UP_MODELS = (
    BIENCODER_MODEL,
    MPNET_BIENCODER_MODEL,
    SUMMARIZER_ECL_MODEL,
    RERANKER_MODEL,
    QUESTION_WRITER_MODEL,
    SUMMARIZER_GEMMA_MODEL,
    SUMMARIZER_RANK_MODEL,
)
"""Every model the set-up can train, by the name it is saved under in the models directory."""
AUTO_ENCODER = "auto"  # `--encoder auto`: the best encoder this machine has (`choose_encoder`)
RETRIEVAL_ENCODERS = (MPNET_BIENCODER_MODEL, BIENCODER_MODEL)
"""The fine-tuned retrieval encoders, best first: fine-tuned MPNet is the one the encoder rule chose (best
development R@1 within the speed bounds, docs/results.md); the MiniLM one is `medfaq setup --fast`'s."""
SUMMARIZERS = (SUMMARIZER_GEMMA_MODEL, SUMMARIZER_ECL_MODEL)
"""Summarizer model names, best first (the Gemma fine-tune scores ROUGE-1 50.75 on MeQSum test against 35.3)."""
RANK_BENCHMARK = "medquad-chq"  # under $MEDFAQ_HOME/benchmarks: the bank-question golds the rank model trains on
RANK_SPLIT = "split-0"  # its seeded train / dev / test parts (`medfaq data split-benchmark --seed 0`)


def model_ready(path: Path | None) -> bool:
    """A saved model directory is complete once its ``config.json`` is written and its training has finished (a
    summarizer's run saves its best epoch before it ends)."""
    return path is not None and (path / "config.json").is_file() and not (path / UNFINISHED_FILE).is_file()


def trained(name: str, models: Path | None = None) -> bool:
    """False only for a set-up model (by name) that is not saved yet; other names are left to the loaders."""
    if name not in SET_UP_MODELS or Path(name).expanduser().exists():
        return True
    return model_ready((models or models_dir()) / name)


def best_summarizer(models: Path | None = None) -> str | None:
    """The best summarizer trained under the models directory, or None."""
    where = models or models_dir()
    return next((name for name in SUMMARIZERS if model_ready(where / name)), None)


def choose_encoder(name: str) -> str:
    """The encoder `--encoder NAME` means: for ``auto``, the best fine-tuned retrieval bi-encoder ``medfaq setup``
    saved (`RETRIEVAL_ENCODERS`: its directory), else the stock encoder the encoder rule chooses from the installed
    ones' shipped measurements (`retriever.decisions.encoder_rule.stock_encoder`); any other name as given."""
    if name != AUTO_ENCODER:
        return name
    saved = (str(path) for path in map(models_dir().joinpath, RETRIEVAL_ENCODERS) if model_ready(path))
    return next(saved, None) or stock_encoder()


def set_up_reranker() -> Path | None:
    """The reranker ``medfaq setup`` saved (the pipeline's default one), or None before it is trained."""
    path = models_dir() / RERANKER_MODEL
    return path if model_ready(path) else None


def reranker_corrects(reranker: Path, encoder: Path) -> bool:
    """Whether the saved reranker at `reranker` was trained as a correction of the bi-encoder at `encoder`."""
    from medfaq.retriever.reranker.base import calibration_first_stage
    from medfaq.retriever.training.config import EncoderTrainConfig

    if not model_ready(reranker):
        return False
    try:
        first_stage = Path(resolve_model(calibration_first_stage(EncoderTrainConfig.load(reranker))))
    except MedfaqError:  # its train config is unreadable, or the encoder it corrects is gone
        return False
    return first_stage.resolve() == encoder.expanduser().resolve()


def index_built(path: Path) -> bool:
    """Whether `path` holds a built index (its manifest)."""
    from medfaq.index.storage import is_index  # imported late: the command line starts without the index stack

    return is_index(path)


def encoded_by(index: Path, encoder: Path) -> bool:
    """Whether the index at `index` is built and was encoded by the model directory `encoder`."""
    from medfaq.index.storage import read_manifest

    if not index_built(index):
        return False
    return Path(read_manifest(index).encoder).expanduser().resolve() == encoder.expanduser().resolve()


def set_up_index_dirs() -> tuple[Path, Path]:
    """Where ``medfaq setup`` builds its indexes, best first: the fine-tuned encoder's, then the stock MiniLM one."""
    return indexes_dir() / FAQ_INDEX, indexes_dir() / STOCK_INDEX


def set_up_index() -> Path:
    """The best index ``medfaq setup`` built (`set_up_index_dirs`)."""
    built = next((path for path in set_up_index_dirs() if index_built(path)), None)
    if built is None:
        raise MedfaqError(
            f"no --index given and no index under {indexes_dir()} yet: run `medfaq setup` "
            "(or `medfaq index build ...`), or pass --index DIR"
        )
    return built


class ModelNotTrained(MedfaqError):
    """A set-up model a command needs (by name, `model`) is not trained yet: the command line offers to train it
    there and then, and to run the command again (`app.cmd_setup.train_on_first_need`)."""

    def __init__(self, model: str, kind: str) -> None:
        self.model = model
        super().__init__(
            f"no {kind} model {model!r} is trained yet: `medfaq setup --model {model}` trains it, or run the command "
            "again as `medfaq --yes ...` (`medfaq setup --all` trains every model)"
        )


def require_trained(name: str, kind: str) -> None:
    """Raise :class:`ModelNotTrained` where `name` is a set-up model (by name) not saved yet."""
    if not trained(name):
        raise ModelNotTrained(name, kind)
