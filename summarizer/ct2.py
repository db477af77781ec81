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
        """The `decoding.mbr` best beams per text, best first, or `decoding.mbr` samples per text (context-aware
        `decoding.guidance` is not supported)."""
        prompts = [
            self.tokenizer.convert_ids_to_tokens(prompt_ids(self.tokenizer, t, max_source_len)[0]) for t in texts
        ]
        copies = decoding.mbr if decoding.sample else 1  # each sample is its own one-hypothesis search
        if decoding.sample:
            search = {"sampling_topk": 0, "sampling_topp": decoding.top_p, "sampling_temperature": decoding.temperature}
        else:
            search = {"sampling_topk": 1, "num_hypotheses": decoding.mbr}
        results = self.generator.generate_batch(
            [prompt for prompt in prompts for _ in range(copies)],
            max_length=decoding.max_length,
            beam_size=decoding.width,
            length_penalty=decoding.length_penalty,
            include_prompt_in_result=False,
            end_token=self.tokenizer.eos_token,
            **search,
        )
        texts_out = [
            [" ".join(text.split()) for text in self.tokenizer.batch_decode(r.sequences_ids, skip_special_tokens=True)]
            for r in results
        ]
        return [sum(texts_out[i * copies : (i + 1) * copies], []) for i in range(len(prompts))]
