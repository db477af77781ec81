"""CTranslate2 int8 generation for decoder-only summarizers (the fastest int8 path measured on CPU).

The conversion is made once, on first use, into ``<summarizer>/ct2-int8`` and reused afterwards.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from medfaq.common.runtime import MedfaqError, make_once
from medfaq.summarizer.decoding import Decoding
from medfaq.summarizer.modeling import prompt_ids

CT2_DIR = "ct2-int8"


def convert(model_dir: Path) -> Path:
    """``model_dir``'s int8 CTranslate2 conversion (made on the first call)."""

    def make(tmp: Path) -> None:
        try:
            from ctranslate2.converters import TransformersConverter
        except ImportError:
            raise MedfaqError("int8 generation of a decoder-only summarizer needs the package ctranslate2") from None
        TransformersConverter(str(model_dir)).convert(str(tmp), quantization="int8")

    return make_once(Path(model_dir) / CT2_DIR, "model.bin", make)


class CT2Generator:
    """Greedy or beam generation with a converted model, which `Summarizer.candidates` calls for decoder-only int8
    summarizers."""

    def __init__(self, model_dir: Path, tokenizer, threads: int = 0):
        import ctranslate2

        self.tokenizer = tokenizer
        self.generator = ctranslate2.Generator(
            str(convert(model_dir)), device="cpu", compute_type="int8", intra_threads=threads
        )

    def __call__(self, texts: Sequence[str], decoding: Decoding, max_source_len: int) -> list[list[str]]:
        """The `decoding.mbr` best beams per text, best first (context-aware `decoding.guidance` is not supported)."""
        prompts = [
            self.tokenizer.convert_ids_to_tokens(prompt_ids(self.tokenizer, t, max_source_len)[0]) for t in texts
        ]
        results = self.generator.generate_batch(
            prompts,
            max_length=decoding.max_length,
            beam_size=decoding.width,
            num_hypotheses=decoding.mbr,
            length_penalty=decoding.length_penalty,
            sampling_topk=1,
            include_prompt_in_result=False,
            end_token=self.tokenizer.eos_token,
        )
        return [
            [" ".join(text.split()) for text in self.tokenizer.batch_decode(r.sequences_ids, skip_special_tokens=True)]
            for r in results
        ]
