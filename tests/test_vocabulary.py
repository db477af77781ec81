"""The trimmed vocabulary: the softmax over the kept rows is the full softmax restricted to them and renormalised;
ids map in and out; generation with it writes only kept tokens."""

from __future__ import annotations

import pytest
import torch

from medfaq.common.runtime import MedfaqError
from medfaq.summarizer.vocabulary import TrimmedVocabulary
from tests.test_summarizer_causal import _tiny_sizes


class Tokenizer:
    """The few attributes TrimmedVocabulary reads."""

    bos_token_id, eos_token_id, pad_token_id = 2, 1, 0
    all_special_ids = [0, 1, 2]
    vocab_size = 64

    def __len__(self) -> int:
        return self.vocab_size


@pytest.fixture(scope="module")
def tiny_gemma():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    return Gemma3ForCausalLM(Gemma3TextConfig(**_tiny_sizes(64), tie_word_embeddings=True)).eval()


def test_trimmed_softmax_is_the_full_softmax_restricted_and_renormalised(tiny_gemma):
    vocabulary = TrimmedVocabulary(Tokenizer(), [5, 9, 17, 30, 31, 40, 63])
    ids = torch.tensor([[2, 5, 9, 40, 17]])
    with torch.inference_mode():
        full = tiny_gemma(input_ids=ids).logits.float()
        with vocabulary.applied(tiny_gemma):
            trimmed = tiny_gemma(input_ids=vocabulary.to_kept(ids)).logits.float()
    restricted = torch.log_softmax(full[..., vocabulary.kept], dim=-1)
    assert trimmed.shape[-1] == len(vocabulary) == 10  # the kept ids and the three special ones
    assert torch.allclose(torch.log_softmax(trimmed, dim=-1), restricted, atol=1e-5)
    assert tiny_gemma.get_input_embeddings().weight.shape[0] == 64  # restored after the block
    assert tiny_gemma.lm_head.weight is tiny_gemma.get_input_embeddings().weight


def test_ids_map_in_and_out_and_an_unkept_id_is_a_clear_error():
    vocabulary = TrimmedVocabulary(Tokenizer(), [7, 3])
    ids = torch.tensor([[2, 3, 7, 0]])
    assert vocabulary.to_kept(ids).tolist() == [[2, 3, 4, 0]]
    assert torch.equal(vocabulary.to_full(vocabulary.to_kept(ids)), ids)
    with pytest.raises(MedfaqError, match=r"token ids \[8\] are not in the trimmed vocabulary"):
        vocabulary.to_kept(torch.tensor([[8]]))


def test_generation_with_a_trimmed_vocabulary_writes_only_kept_tokens(tiny_gemma):
    from medfaq.summarizer.decoding import Decoding
    from medfaq.summarizer.generation import sampling_arguments

    vocabulary = TrimmedVocabulary(Tokenizer(), range(10, 20))
    prompt = vocabulary.to_kept(torch.tensor([[2, 11, 12]]))
    with torch.inference_mode(), vocabulary.applied(tiny_gemma):
        torch.manual_seed(0)
        out = tiny_gemma.generate(
            input_ids=prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=12,
            eos_token_id=1,
            pad_token_id=0,
            **sampling_arguments(Decoding(mbr=3, sample=True)),
            num_return_sequences=3,
        )
    written = vocabulary.to_full(out[:, prompt.size(1) :])
    assert set(written.flatten().tolist()) <= set(range(10, 20)) | {0, 1, 2}
