"""Seq2seq backbones for the summarizer: any Hugging Face seq2seq model, or a BERT2BERT warm-started from MiniLM.

`load_backbone(name)` returns ``(model, tokenizer)`` for three kinds of names:

* ``"minilm"`` (the offline default) or a BERT-like encoder-only directory: an :class:`EncoderDecoderModel` whose
  encoder and decoder are both warm-started from those weights (the decoder gets fresh cross-attention layers);
  ``decoder_start_token_id`` = CLS, ``eos_token_id`` = SEP, ``pad_token_id`` = PAD;
* a trained summarizer directory (saved by the trainer), reloaded with its tokenizer;
* any seq2seq model id or path, e.g. ``facebook/bart-large``, through ``AutoModelForSeq2SeqLM``.

Every name goes through :func:`index.runtime.resolve_model`. Both kinds expose ``model.get_encoder()``.
"""

from __future__ import annotations

import logging
from pathlib import Path

from index.runtime import MedfaqError, resolve_model

logger = logging.getLogger("medfaq")


def load_backbone(name: str | Path | None = "minilm"):
    """Load `(model, tokenizer)` for training or generation; see the module docstring for the accepted names."""
    from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer, EncoderDecoderModel
    from transformers.utils import logging as hf_logging

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
