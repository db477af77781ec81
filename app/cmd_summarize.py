"""`medfaq train summarizer` and `medfaq summarize`: ECL training and generation."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from medfaq.app.options import finite
from medfaq.common.runtime import PRECISION_HELP, MedfaqError

DEFAULT_PRETRAIN = ["rqe:train", "healthcaremagic:train", "chq_summ:train"]
TEXT_FIELDS = ("chq", "question", "text")


def _pairs(spec: str, data_root: Path | None) -> list[tuple[str, str]]:
    from medfaq.eval.summarization_data import load_pairs

    return [(pair.chq, pair.faq) for pair in load_pairs(spec, data_root)]


def train_summarizer(
    data: str = typer.Option("meqsum", "--data", help="Data set with train and valid splits (e.g. meqsum)."),
    train_data: str | None = typer.Option(
        None,
        "--train-data",
        help="Training pairs instead of DATA:train, e.g. meqsum:train+meqsum:valid for a final model (its "
        "validation then scores pairs it trained on: keep last/, with a recipe chosen on a held-out valid split).",
    ),
    variant: str = typer.Option("ecl", "--variant", help="ecl|mle|ecl-s|ecl-h|qfcl|learned."),
    preset: str = typer.Option(
        "quick", "--preset", help="quick (MiniLM: ≤ 20 min on 2 CPU cores; Gemma: 2 epochs) | full (GPU)."
    ),
    seed: int = typer.Option(0, "--seed", help="Random seed."),
    out: Path = typer.Option(..., "--out", help="Output directory (the best model; last/ holds the checkpoint)."),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted run in --out from last/."),
    pretrain: bool = typer.Option(False, "--pretrain", help=f"Pre-train on {', '.join(DEFAULT_PRETRAIN)} first."),
    pretrain_data: list[str] | None = typer.Option(None, "--pretrain-data", help="Pre-training split (repeatable)."),
    data_root: Path | None = typer.Option(None, "--data-root", help="Read data laid out like ../shared/data."),
    backbone: str | None = typer.Option(
        None, "--backbone", help="minilm, gemma-3-270m, a directory, or a HF seq2seq or causal-LM id."
    ),
    freeze_embeddings: bool | None = typer.Option(
        None, "--freeze-embeddings/--train-embeddings", help="Decoder-only backbones: freeze the token embedding."
    ),
    lora_rank: int | None = typer.Option(
        None, "--lora-rank", min=0, help="Decoder-only backbones: train LoRA adapters of this rank (0: full weights)."
    ),
    learned_temperature: float | None = typer.Option(None, "--learned-temperature"),
    alpha: float | None = typer.Option(None, "--alpha", help="Weight of the simple-negative loss."),
    beta: float | None = typer.Option(None, "--beta", help="Weight of the hard-negative loss."),
    label_smoothing: float | None = typer.Option(None, "--label-smoothing"),
    momentum: float | None = typer.Option(None, "--momentum", help="Key encoder momentum (0: sized to the run)."),
    queue_size: int | None = typer.Option(None, "--queue-size", help="Queued FAQ keys (0: half the data)."),
    temperature: float | None = typer.Option(None, "--temperature"),
    n_hard_negatives: int | None = typer.Option(None, "--n-hard-negatives"),
    n_frame_negatives: int | None = typer.Option(
        None, "--n-frame-negatives", help="Extra hard negatives per pair with the FAQ's question frame swapped."
    ),
    n_learned_negatives: int | None = typer.Option(None, "--n-learned-negatives"),
    diversity_weight: float | None = typer.Option(None, "--diversity-weight"),
    generator_lr: float | None = typer.Option(None, "--generator-lr"),
    lr: float | None = typer.Option(None, "--lr"),
    weight_decay: float | None = typer.Option(None, "--weight-decay"),
    warmup_ratio: float | None = typer.Option(None, "--warmup-ratio"),
    batch_size: int | None = typer.Option(None, "--batch-size"),
    grad_accum: int | None = typer.Option(None, "--grad-accum"),
    epochs: int | None = typer.Option(None, "--epochs"),
    max_source_len: int | None = typer.Option(None, "--max-source-len"),
    max_target_len: int | None = typer.Option(None, "--max-target-len"),
    eval_beams: int | None = typer.Option(None, "--eval-beams"),
    eval_max_length: int | None = typer.Option(None, "--eval-max-length"),
    eval_examples: int | None = typer.Option(None, "--eval-examples", help="Validate on the first N pairs."),
    patience: int | None = typer.Option(None, "--patience", help="Early stopping after N epochs without gain."),
    pretrain_epochs: int | None = typer.Option(None, "--pretrain-epochs"),
    pretrain_examples: int | None = typer.Option(None, "--pretrain-examples", help="Sample N pre-training pairs."),
    device: str | None = typer.Option(None, "--device", help="cpu or cuda (default: cuda when visible)."),
    threads: int | None = typer.Option(None, "--threads", help="Torch CPU threads."),
    precision: str | None = typer.Option(None, "--precision", help=PRECISION_HELP),
    save_every_steps: int | None = typer.Option(None, "--save-every-steps"),
    max_steps: int | None = typer.Option(None, "--max-steps", help="Stop with a checkpoint after N steps."),
) -> None:
    """Train the CHQ→FAQ summarizer with one ECL variant; prints one JSON line per epoch.

    With ``--backbone gemma-3-270m`` the first run de-quantises the bundled Gemma 3 270M once into the models directory.
    """
    from dataclasses import fields

    from medfaq.summarizer.trainer import LAST_DIR, SummarizerTrainConfig, preset_config, train_summarizer

    given = locals()
    tuned = {f.name for f in fields(SummarizerTrainConfig)} - {"variant", "preset", "seed", "pretrain"}
    options = {key: given[key] for key in tuned if given.get(key) is not None}
    if pretrain or pretrain_data:
        options["pretrain"] = list(pretrain_data or DEFAULT_PRETRAIN)
    if resume:
        if not (out / LAST_DIR).is_dir():
            raise MedfaqError(f"nothing to resume in {out} (no {LAST_DIR}/ checkpoint)")
        saved = SummarizerTrainConfig.load(out / LAST_DIR)
        options.setdefault("max_steps", 0)  # a stop requested for the interrupted run does not carry over
        config = SummarizerTrainConfig(**{**saved.__dict__, **options})
    else:
        config = preset_config(preset, variant, seed=seed, **options)
    train = _pairs(config.train_data or f"{data}:train", data_root)
    valid = _pairs(f"{data}:valid", data_root)
    extra = [pair for spec in config.pretrain for pair in _pairs(spec, data_root)]
    history = train_summarizer(config, train, valid, out, resume=resume, pretrain_pairs=extra)
    best = max((h["valid_rougeL"] for h in history if h.get("stage") == "main"), default=None)
    typer.echo(
        f"trained {config.variant} ({config.preset}, seed {config.seed}); best valid ROUGE-L "
        f"{'n/a' if best is None else f'{best:.2f}'}; model in {out}"
    )


def average(
    runs: list[str] = typer.Argument(..., help="Trained summarizer directories: one recipe, different seeds."),
    out: Path = typer.Option(..., "--out", help="Output directory for the averaged summarizer."),
) -> None:
    """Average the weights of summarizers trained with different seeds (a model soup): one model, as fast as each."""
    from medfaq.summarizer.averaging import average_summarizers

    typer.echo(f"averaged {len(runs)} summarizers into {average_summarizers(runs, out)}")


def read_texts(path: Path) -> tuple[list[dict], list[str]]:
    """The rows of a JSONL file of questions and each row's text; a row without text, or with empty or invalid
    text, is a one-line error naming its line."""
    from medfaq.retriever.search import check_query

    if not path.is_file():
        raise MedfaqError(f"input file {path} does not exist")
    rows, texts = [], []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise MedfaqError(f"{path}:{number}: not valid JSON") from None
        text = next((row[k] for k in TEXT_FIELDS if isinstance(row, dict) and isinstance(row.get(k), str)), None)
        if text is None:
            raise MedfaqError(f"{path}:{number}: needs a text field ({' or '.join(TEXT_FIELDS)})")
        rows.append(row)
        texts.append(check_query(text, f"{path}:{number}: the question"))
    return rows, texts


MBR = typer.Option(
    1, "--mbr", min=1, help="Pick among the N best beams by minimum Bayes risk (mean ROUGE with the others); 1 = off."
)
GUIDANCE = typer.Option(
    0.0,
    "--guidance",
    min=0.0,
    callback=finite,
    help="Context-aware decoding weight W: score (1+W) log p(y|CHQ) - W log p(y|no CHQ); 0 = off (decoder-only).",
)
LENGTH_PENALTY = typer.Option(
    1.0,
    "--length-penalty",
    callback=finite,
    help="Beam search: a finished summary scores its log-probability divided by length**P; above 1 favours longer.",
)


def summarize(
    text: str | None = typer.Argument(None, help="A consumer health question (omit with --input)."),
    model: str | None = typer.Option(
        None, "--model", help="Trained summarizer directory or name (default: the best one `medfaq setup` trained)."
    ),
    input: Path | None = typer.Option(None, "--input", help='JSONL file of {"chq"|"question"|"text": ...} lines.'),
    output: Path | None = typer.Option(None, "--output", help='JSONL to write (input rows plus "summary").'),
    num_beams: int = typer.Option(1, "--num-beams", min=1, help="Beam size (1: greedy)."),
    max_length: int = typer.Option(64, "--max-length", min=1, help="Maximum new tokens per summary."),
    batch_size: int = typer.Option(16, "--batch-size", min=1, help="Questions per batch."),
    mbr: int = MBR,
    guidance: float = GUIDANCE,
    length_penalty: float = LENGTH_PENALTY,
    device: str | None = typer.Option(None, "--device", help="cpu or cuda."),
) -> None:
    """Summarize consumer health questions into short FAQ-style questions."""
    from medfaq.retriever.runs import check_not_an_input
    from medfaq.retriever.search import check_query
    from medfaq.retriever.setup_plan import best_summarizer
    from medfaq.retriever.stages import set_up_model
    from medfaq.summarizer.decoding import Decoding
    from medfaq.summarizer.generation import Summarizer

    if (text is None) == (input is None):
        raise MedfaqError("give either a question or --input FILE.jsonl (with --output OUT.jsonl)")
    if input is not None and output is None:
        raise MedfaqError("--input needs --output OUT.jsonl")
    if output is not None:
        check_not_an_input(output, input)
    rows, texts = read_texts(input) if input is not None else ([], [check_query(text, "the question")])
    chosen = set_up_model(model, "summarizer", best_summarizer())
    decoding = Decoding(num_beams, max_length, length_penalty, guidance, mbr)
    summaries = Summarizer.load(chosen, device=device).summarize(texts, decoding, batch_size)
    if input is None:
        typer.echo(summaries[0])
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    with output.open("w", encoding="utf-8") as handle:
        for row, summary in zip(rows, summaries, strict=True):
            handle.write(json.dumps({**row, "summary": summary}, ensure_ascii=False) + "\n")
    typer.echo(f"wrote {len(summaries)} summaries to {output}")


def register(app: typer.Typer, *, data_app: typer.Typer, train_app: typer.Typer, eval_app: typer.Typer) -> None:
    """Add this module's commands to the `medfaq` command groups."""
    train_app.command("summarizer")(train_summarizer)
    train_app.command("average")(average)
    app.command("summarize")(summarize)
