"""Summarizer speed on CPU: per-question greedy latency (batch 1) and batched throughput (questions/s) for fp32,
PyTorch int8 dynamic quantisation and, for decoder-only models, CTranslate2 int8 (converted once into
``<model>/ct2-int8``).

    python experiments/summarizer_speed.py --model gemma-3-270m --questions 20 --batch-size 16 --out speed.json

`--model` is a trained summarizer or a bare backbone (``minilm``, ``gemma-3-270m``, any seq2seq or causal LM): the
latency of a backbone is that of a summarizer trained from it for the same number of generated tokens, which is
reported beside every figure. Questions are MeQSum test CHQs in file order; the throughput run generates for all of
them in batches of `--batch-size` (inputs sorted by length, as `medfaq summarize` does).

`--onnx FILE` adds ONNX Runtime: the same decoder-only model exported with its KV cache and quantised to int8, e.g.
``optimum-cli export onnx --model ~/.medfaq/models/gemma-3-270m --task text-generation-with-past gemma-onnx`` then
``onnxruntime.quantization.quantize_dynamic("gemma-onnx/model.onnx", "gemma-onnx/int8.onnx")`` (the exporter,
optimum-onnx, needs transformers < 4.58: run it in an environment of its own).

Results: docs/experiments/summarizer.md, "Summarizer with a pretrained decoder: Gemma 3 270M (issue 13)", its
"Generation speed, Gemma 3 270M backbone (batch 1, greedy, KV cache, 24 new tokens, 2 threads)"; "Gemma int8
backends on an AVX2 CPU: latency, throughput and ROUGE cost (CTranslate2 kept)".
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from medfaq.common.runtime import MedfaqError
from medfaq.eval.script_args import existing_file, positive_int, report_or_error


def latency(generate: Callable[[str], tuple[str, int]], texts: Sequence[str]) -> dict[str, float]:
    """p50/p90 milliseconds per question and mean generated tokens, after one warm-up question."""
    from tqdm.auto import tqdm

    generate(texts[0])
    times, tokens = [], []
    for text in tqdm(texts, desc="questions", leave=False):
        start = time.perf_counter()
        _, count = generate(text)
        times.append(1000.0 * (time.perf_counter() - start))
        tokens.append(count)
    times.sort()
    return {
        "p50_ms": statistics.median(times),
        "p90_ms": times[min(len(times) - 1, int(0.9 * len(times)))],
        "mean_new_tokens": statistics.fmean(tokens),
        "questions": len(texts),
    }


def throughput(generate_batch: Callable[[list[str]], list[str]], texts: Sequence[str], batch_size: int) -> dict:
    """Questions per second over `texts` generated in batches of `batch_size` (longest first), after one warm-up
    batch."""
    ordered = sorted(texts, key=len, reverse=True)
    generate_batch(list(ordered[:batch_size]))
    start = time.perf_counter()
    for first in range(0, len(ordered), batch_size):
        generate_batch(list(ordered[first : first + batch_size]))
    seconds = time.perf_counter() - start
    return {"questions_per_s": len(ordered) / seconds, "batch_size": batch_size}


def torch_generator(model_name: str, quantize: bool, max_new_tokens: int, max_source_len: int):
    """Greedy generation with the KV cache through transformers (optionally int8 dynamic quantisation): a function of
    one question (text, new tokens) and one of a batch (texts)."""
    import torch

    from medfaq.common.runtime import quantize_linear
    from medfaq.summarizer.decoding import Decoding
    from medfaq.summarizer.generation import generate_candidates, left_padded
    from medfaq.summarizer.modeling import is_causal_lm, load_backbone, prompt_ids

    model, tokenizer = load_backbone(model_name)
    model.eval()
    if quantize:
        quantize_linear(model)
    causal = is_causal_lm(model)

    def generate(text: str) -> tuple[str, int]:
        if causal:
            encoded = left_padded([prompt_ids(tokenizer, text, max_source_len)[0]], tokenizer)
        else:
            encoded = dict(tokenizer([text], max_length=max_source_len, truncation=True, return_tensors="pt"))
        with torch.inference_mode():
            out = model.generate(**encoded, do_sample=False, num_beams=1, use_cache=True, max_new_tokens=max_new_tokens)
        new = out[0, encoded["input_ids"].size(1) :] if causal else out[0, 1:]
        return tokenizer.decode(new, skip_special_tokens=True), int(new.numel())

    def generate_batch(texts: list[str]) -> list[str]:
        found = generate_candidates(
            model,
            tokenizer,
            texts,
            Decoding(max_length=max_new_tokens),
            batch_size=len(texts),
            max_source_len=max_source_len,
            progress=False,
        )
        return [beams[0] for beams in found]

    return generate, generate_batch


def ct2_generator(model_name: str, max_new_tokens: int, max_source_len: int, threads: int):
    """Greedy generation with the CTranslate2 int8 conversion of a decoder-only model (converted on first use): a
    function of one question (text, new tokens) and one of a batch (texts)."""
    from medfaq.common.runtime import resolve_model
    from medfaq.summarizer.ct2 import CT2Generator
    from medfaq.summarizer.decoding import Decoding
    from medfaq.summarizer.modeling import load_backbone

    _, tokenizer = load_backbone(model_name)
    generator = CT2Generator(Path(resolve_model(model_name)), tokenizer, threads)
    greedy = Decoding(max_length=max_new_tokens)

    def generate(text: str) -> tuple[str, int]:
        output = generator([text], greedy, max_source_len)[0][0]
        return output, len(tokenizer(output, add_special_tokens=False)["input_ids"])

    def generate_batch(texts: list[str]) -> list[str]:
        return [beams[0] for beams in generator(texts, greedy, max_source_len)]

    return generate, generate_batch


def ort_generator(onnx_file: Path, model_name: str, max_new_tokens: int, max_source_len: int, threads: int):
    """Greedy generation with an ONNX Runtime session of a decoder-only model exported with its KV cache (inputs
    ``input_ids``, ``attention_mask``, ``past_key_values.N.key|value``; outputs ``logits``, ``present.N.key|value``):
    a function of one question (text, new tokens) and one of a batch (texts)."""
    try:
        import onnxruntime
    except ImportError:
        raise MedfaqError("--onnx needs the package onnxruntime") from None
    from medfaq.summarizer.generation import left_padded
    from medfaq.summarizer.modeling import load_tokenizer, prompt_ids

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(str(onnx_file), options, providers=["CPUExecutionProvider"])
    tokenizer = load_tokenizer(model_name)
    stop_ids = {tokenizer.eos_token_id}  # where the PyTorch and CTranslate2 paths stop too

    def generate_ids(texts: list[str]) -> list[list[int]]:
        encoded = left_padded([prompt_ids(tokenizer, text, max_source_len)[0] for text in texts], tokenizer)
        return greedy_with_cache(
            session, encoded["input_ids"].numpy(), encoded["attention_mask"].numpy(), max_new_tokens, stop_ids
        )

    def generate(text: str) -> tuple[str, int]:
        new = generate_ids([text])[0]
        return tokenizer.decode(new, skip_special_tokens=True), len(new)

    def generate_batch(texts: list[str]) -> list[str]:
        return [" ".join(t.split()) for t in tokenizer.batch_decode(generate_ids(texts), skip_special_tokens=True)]

    return generate, generate_batch


def greedy_with_cache(session, input_ids, attention_mask, max_new_tokens: int, stop_ids: set[int]) -> list[list[int]]:
    """Greedy decoding through an ONNX decoder session with its KV cache; each row's new ids up to (not including)
    its first stop id."""
    import numpy as np

    past = {
        item.name: np.zeros((input_ids.shape[0], *[d if isinstance(d, int) else 0 for d in item.shape[1:]]), np.float32)
        for item in session.get_inputs()
        if item.name.startswith("past_key_values.")
    }
    outputs = [output.name for output in session.get_outputs()]
    new: list[list[int]] = [[] for _ in range(input_ids.shape[0])]
    done = np.zeros(input_ids.shape[0], dtype=bool)
    for _ in range(max_new_tokens):
        results = dict(
            zip(
                outputs,
                session.run(outputs, {"input_ids": input_ids, "attention_mask": attention_mask, **past}),
                strict=True,
            )
        )
        next_ids = results["logits"][:, -1].argmax(-1)
        for row, token in enumerate(next_ids.tolist()):
            done[row] |= token in stop_ids
            if not done[row]:
                new[row].append(token)
        if done.all():
            break
        input_ids = next_ids[:, None].astype(np.int64)
        attention_mask = np.concatenate([attention_mask, np.ones_like(input_ids)], axis=1)
        past = {
            name.replace("present.", "past_key_values."): value
            for name, value in results.items()
            if name.startswith("present.")
        }
    return new


def measure(args: argparse.Namespace) -> dict:
    """The report: per backend, latency and batched throughput of generating summaries of the first questions."""
    import torch

    from medfaq.eval.summarization_data import load_pairs
    from medfaq.summarizer.modeling import backbone_is_causal

    torch.set_num_threads(args.threads)
    texts = [pair.chq for pair in load_pairs(args.data)[: args.questions]]
    backends = {
        "fp32 (PyTorch)": lambda: torch_generator(args.model, False, args.max_new_tokens, args.max_source_len),
        "int8 dynamic (PyTorch)": lambda: torch_generator(args.model, True, args.max_new_tokens, args.max_source_len),
    }
    if not args.no_ct2 and backbone_is_causal(args.model):
        backends["int8 (CTranslate2)"] = lambda: ct2_generator(
            args.model, args.max_new_tokens, args.max_source_len, args.threads
        )
    if args.onnx is not None:
        backends["int8 (ONNX Runtime)"] = lambda: ort_generator(
            args.onnx, args.model, args.max_new_tokens, args.max_source_len, args.threads
        )
    rows = {}
    for name, make in backends.items():
        generate, generate_batch = make()
        rows[name] = {**latency(generate, texts), **throughput(generate_batch, texts, args.batch_size)}
    return {"model": args.model, "threads": args.threads, "max_new_tokens": args.max_new_tokens, "rows": rows}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python experiments/summarizer_speed.py", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma-3-270m")
    parser.add_argument("--data", default="meqsum:test")
    parser.add_argument("--questions", type=positive_int, default=20)
    parser.add_argument("--max-new-tokens", type=positive_int, default=32)
    parser.add_argument("--max-source-len", type=positive_int, default=120)
    parser.add_argument("--batch-size", type=positive_int, default=16, help="Batch size of the throughput run.")
    parser.add_argument("--threads", type=positive_int, default=2)
    parser.add_argument("--no-ct2", action="store_true", help="Skip CTranslate2 (decoder-only models only).")
    parser.add_argument(
        "--onnx", type=existing_file, default=None, help="Also measure this int8 ONNX export of the model."
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    return report_or_error(lambda: measure(args), args.out)


if __name__ == "__main__":
    sys.exit(main())
