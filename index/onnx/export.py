"""Exports a sentence-transformers model for :mod:`medfaq.index.onnx.encoder` (needs torch; runs once per model);
:func:`ensure_export` keeps an export, the bi-encoder's or the cross-encoder's, up to date with its model.

The whole module chain becomes one ONNX graph (TorchScript exporter, eager attention so ONNX Runtime's transformer
optimizer can fuse it), written as ``model.onnx`` after fusion, with its weights in a ``.data`` file beside it. The
export is checked against sentence-transformers on probe texts before it is kept; a fused graph that drifts is
replaced by the plain one. ``model_int8.onnx``, its dynamic int8 quantisation (the first setting whose probe search
agrees with the fp32 graph's, index/onnx/check.py; none: no int8 graph), is made the first time it is asked for.
An export or a quantisation made on the way to a search is announced in one line: it takes up to a minute or two
(``medfaq index build`` exports the index's encoder beforehand).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from medfaq.common.runtime import MedfaqError, make_once
from medfaq.index.onnx.check import GraphCheck
from medfaq.index.onnx.graph import (
    EXPORT_INFO,
    EXPORT_VERSION,
    GRAPHS,
    PROBE_OUTPUTS,
    TOKENIZER_FILE,
    ExportInfo,
    OnnxGraph,
    export_location,
    source_signature,
)

logger = logging.getLogger("medfaq.encoder")

OPSET = 17
TOLERANCE = 1e-4  # largest difference from sentence-transformers' vectors an fp32 export may show
PROBES = [
    "What are the symptoms of type 2 diabetes?",
    "  CAN I take IBUPROFEN with   amoxicillin?? ",
    "",
    "什么是糖尿病 😀",
    "shingles " * 400,  # longer than any max_seq_length: truncation
]
"""Texts the export is checked on: ordinary, odd spacing and case, empty, non-Latin, too long."""


def export_encoder(location: str, out: Path) -> None:
    """Export the sentence-transformers model at `location` into the new directory `out`."""
    model = _load(location)
    transformer = model[0]
    tokenizer = getattr(transformer, "tokenizer", None)
    if getattr(tokenizer, "backend_tokenizer", None) is None:
        raise MedfaqError(f"encoder {location} has no fast (Rust) tokenizer; use --encoder-backend torch")
    features = model.preprocess(PROBES[:2])
    raw, info = trace_export(model, tokenizer, features, location, out, int(model.get_embedding_dimension()))
    expected = model.encode(PROBES, convert_to_numpy=True, normalize_embeddings=True)
    failure = f"the ONNX export of {location} differs from sentence-transformers by {{drift:.2g}}"
    config = transformer.auto_model.config
    drift = finish_export(raw, info, config, lambda: _drift(out, info, expected), failure, TOLERANCE)
    logger.info("exported %s to ONNX in %s (fp32 within %.1g of torch)", location, out, drift)


def ensure_export(
    location: str,
    export: Callable[[str, Path], None] | None = None,
    precision: str = "fp32",
    announce: Callable[[str], None] | None = None,
) -> Path:
    """The directory of an up-to-date export of the model at `location`, made (with torch, once) by
    ``export(location, directory)`` (default: :func:`export_encoder`) when missing or older than the model's files;
    with `precision` ``int8`` also its int8 graph, made the first time (:func:`ensure_int8`). Each piece of work is
    announced first by ``announce(line)`` (default: a warning on stderr)."""
    announce = announce or logger.warning
    directory = export_location(location)
    info = ExportInfo.read(directory)
    if info is not None and (info.version != EXPORT_VERSION or info.source != source_signature(location)):
        logger.info("the model at %s changed since its ONNX export; exporting it again", location)
        (directory / EXPORT_INFO).unlink(missing_ok=True)
        info = None
    if info is None:
        announce(f"exporting {location} to ONNX Runtime, once (up to a minute or two)")
        make_once(directory, EXPORT_INFO, lambda out: (export or export_encoder)(location, out))
    if precision == "int8":
        ensure_int8(directory, location, announce)
    return directory


def ensure_int8(directory: Path, name: str, announce: Callable[[str], None]) -> None:
    """Make the int8 graph of the export in `directory` (of the model `name`) unless one was tried already
    (:func:`quantize_checked`: kept only where its check passed), under the export's lock."""
    from filelock import FileLock

    if "int8" in ExportInfo.read(directory).checks:
        return
    with FileLock(str(directory) + ".lock"):  # make_once's lock: one process quantises
        info = ExportInfo.read(directory)
        if "int8" in info.checks:
            return
        announce(f"quantising the ONNX graph of {name} to int8, once (up to a minute)")
        check = quantize_checked(directory / GRAPHS["fp32"], directory / GRAPHS["int8"], info, name)
        info.checks["int8"] = check.to_dict()
        store_weights_apart(directory, "int8")
        info.save(directory)


def finish_export(
    raw: Path, info: ExportInfo, config: Any, drift: Callable[[], float], failure: str, tolerance: float
) -> float:
    """Make the fp32 graph of the export beside `raw` (the traced graph) and save `info` there; returns its drift.

    The fp32 graph is `raw` fused by ONNX Runtime's optimizer, or `raw` itself where the fused graph's `drift()`
    (its largest difference from PyTorch, measured on probes) exceeds `tolerance`; a drift above it then is the
    one-line error `failure` (``{drift}`` in it is filled in). Its weights go into a ``.data`` file beside it.
    """
    out = raw.parent
    fp32 = out / GRAPHS["fp32"]
    info.optimized = optimize(raw, fp32, config)
    if info.optimized and drift() > tolerance:
        logger.info("the fused ONNX graph in %s drifts from PyTorch; keeping the plain graph", out)
        info.optimized = False
    if not info.optimized:
        raw.replace(fp32)
    error = drift()
    if error > tolerance:
        reason = failure.format(drift=error)
        raise MedfaqError(f"{reason} (more than {tolerance}); use --encoder-backend torch")
    info.checks = {"fp32": {"max_difference_from_torch": error}}
    raw.unlink(missing_ok=True)
    store_weights_apart(out, "fp32")
    info.save(out)
    return error


def quantize_checked(fp32: Path, int8: Path, info: ExportInfo, name: str) -> GraphCheck:
    """Quantise `fp32` into `int8` with the first of :data:`QUANTIZATION_SETTINGS` whose probe search agrees with
    the fp32 graph's, saving the fp32 graph's probe outputs beside it; returns the last check made (failed: no
    `int8` graph is left)."""
    directory = fp32.parent
    info.save(directory)
    source = OnnxGraph(directory, "fp32").probe_outputs()
    np.save(directory / PROBE_OUTPUTS, source, allow_pickle=False)
    check = None
    for setting, options in QUANTIZATION_SETTINGS.items():
        quantize(fp32, int8, **options)
        check = OnnxGraph(directory, "int8", verify=False).check(source, setting)
        if check.passed:
            logger.info("int8 graph of %s (%s): %s", name, setting, check.describe())
            return check
        logger.info("int8 graph of %s (%s) refused: %s", name, setting, check.describe())
    int8.unlink(missing_ok=True)
    logger.info("no int8 graph of %s agrees with its fp32 graph; only fp32 is kept (%s)", name, check.describe())
    return check


def _load(location: str) -> Any:
    from sentence_transformers import SentenceTransformer

    try:
        return SentenceTransformer(location, device="cpu", model_kwargs={"attn_implementation": "eager"})
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as error:
        reason = " ".join(str(error).split())[:200]
        raise MedfaqError(f"cannot load encoder {location!r} to export it ({type(error).__name__}: {reason})") from None


def trace_export(
    model: Any,
    tokenizer: Any,
    features: dict[str, Any],
    location: str,
    out: Path,
    dim: int,
    output: str = "sentence_embedding",
    activation: str = "",
) -> tuple[Path, ExportInfo]:
    """Trace `model` (from the model directory `location`) into ``raw.onnx`` in the new directory `out`, save its
    fast tokenizer there (neither cutting nor padding), and return that graph and the export's :class:`ExportInfo`."""
    from medfaq.index.model_files import model_fingerprint

    inputs = [name for name in ("input_ids", "attention_mask", "token_type_ids") if name in features]
    out.mkdir(parents=True)
    raw = out / "raw.onnx"
    export_graph(model, inputs, features, raw, output)
    backend_tokenizer = tokenizer.backend_tokenizer
    backend_tokenizer.no_truncation()
    backend_tokenizer.no_padding()
    backend_tokenizer.save(str(out / TOKENIZER_FILE))
    info = ExportInfo(
        fingerprint=model_fingerprint(model),
        dim=dim,
        max_seq_length=int(model.max_seq_length),
        inputs=inputs,
        pad_id=int(tokenizer.pad_token_id or 0),
        pad_token=str(tokenizer.pad_token or "[PAD]"),
        source=source_signature(location),
        activation=activation,
    )
    return raw, info


def export_graph(
    model: Any, inputs: list[str], features: dict[str, Any], path: Path, output: str = "sentence_embedding"
) -> None:
    """The sentence-transformers module chain, (inputs) -> its `output` feature, with batch and sequence axes
    left free."""
    import torch

    class Chain(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
            return self.model(dict(zip(inputs, tensors, strict=True)))[output]

    axes = {name: {0: "batch", 1: "sequence"} for name in inputs}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer notes on shape checks that hold for every input
        torch.onnx.export(
            Chain().eval(),
            tuple(features[name] for name in inputs),
            str(path),
            input_names=inputs,
            output_names=[output],
            dynamic_axes={**axes, output: {0: "batch"}},
            opset_version=OPSET,
            dynamo=False,
        )


def optimize(raw: Path, out: Path, config: Any) -> bool:
    """ONNX Runtime's transformer fusions (attention, layer norm, GELU) of `raw` into `out`; False when the
    optimizer cannot read this architecture."""
    from onnxruntime.transformers.optimizer import optimize_model

    heads, hidden = getattr(config, "num_attention_heads", 0), getattr(config, "hidden_size", 0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            optimized = optimize_model(str(raw), model_type="bert", num_heads=heads, hidden_size=hidden, opt_level=1)
        optimized.save_model_to_file(str(out))
    except Exception as error:  # noqa: BLE001 - any optimizer failure leaves the plain graph, which is checked
        logger.info("ONNX Runtime's optimizer failed (%s); keeping the plain graph", error)
        return False
    return True


def _drift(directory: Path, info: ExportInfo, expected: np.ndarray) -> float:
    """Largest absolute difference between the fp32 graph's unit vectors and `expected`."""
    info.save(directory)
    vectors = OnnxGraph(directory, "fp32").embed(PROBES)
    vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    return float(np.abs(vectors - expected).max())


QUANTIZATION_SETTINGS: dict[str, dict[str, bool]] = {
    "per-channel": {},
    "per-channel, feed-forward outputs in fp32": {"ffn_outputs": False},
    "per-channel 7-bit, feed-forward outputs in fp32": {"ffn_outputs": False, "reduce_range": True},
}
"""The int8 settings tried in order, each kept only where its probe search agrees with the fp32 graph's."""


def store_weights_apart(directory: Path, precision: str) -> None:
    """Rewrite the `precision` graph in `directory` (if there is one) with its weights in a ``.data`` file beside it,
    which ONNX Runtime maps instead of parsing: a MiniLM session starts in 0.07 s of CPU instead of 0.19 s, and
    computes the same."""
    import onnx

    graph = directory / GRAPHS[precision]
    if graph.is_file():
        data = graph.with_name(graph.name + ".data")
        model = onnx.load(str(graph))
        onnx.save_model(model, str(graph), save_as_external_data=True, all_tensors_to_one_file=True, location=data.name)
        data.chmod(graph.stat().st_mode & 0o777)  # onnx writes it private; the graph's own permissions


def quantize(fp32: Path, int8: Path, reduce_range: bool = False, ffn_outputs: bool = True) -> None:
    """Dynamic int8 quantisation of `fp32` into `int8`, weights per channel (per-tensor scales cost MiniLM up to 0.07
    of cosine); `reduce_range`: 7-bit weights (AVX2's U8S8 kernels saturate on 8); `ffn_outputs` False keeps in fp32
    the feed-forward output projections, whose GELU inputs carry the outliers that ruin all-mpnet-base-v2's int8
    vectors (a probe cosine of 0.82 with fp32's; 0.99 without them)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    excluded = [] if ffn_outputs else feed_forward_outputs(onnx.load(str(fp32), load_external_data=False))
    logging.disable(logging.WARNING)  # the quantizer logs every tensor, and a pre-processing hint it does not need
    try:
        quantize_dynamic(
            str(fp32),
            str(int8),
            weight_type=QuantType.QInt8,
            per_channel=True,
            reduce_range=reduce_range,
            nodes_to_exclude=excluded,
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},  # fused contrib ops carry no inferred types
        )
    finally:
        logging.disable(logging.NOTSET)


GELU_OPS = {"Gelu", "BiasGelu", "FastGelu", "Erf"}
"""A GELU, fused or (``Erf``) as the plain graph spells it."""


def feed_forward_outputs(model: Any) -> list[str]:
    """Names of the MatMul nodes of `model` whose input is a GELU's output (within three elementwise steps)."""
    producers = {output: node for node in model.graph.node for output in node.output}

    def after_gelu(tensor: str, steps: int) -> bool:
        node = producers.get(tensor)
        if node is None or steps < 0:
            return False
        if node.op_type in GELU_OPS:
            return True
        return node.op_type in {"Mul", "Add", "Div"} and any(after_gelu(name, steps - 1) for name in node.input)

    return [node.name for node in model.graph.node if node.op_type == "MatMul" and after_gelu(node.input[0], 3)]
