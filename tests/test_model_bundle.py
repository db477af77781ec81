"""`medfaq models export|import|list` and `medfaq setup --from`: the set-up's models and MedQuAD index travel as one
file, and search in another home gives the same results; a damaged, truncated, foreign, newer or hostile file is one
line and leaves the home as it was."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from medfaq.app.cli import app
from medfaq.app.setup_plan import RERANKER
from medfaq.common.runtime import indexes_dir, medfaq_home, models_dir, utc_timestamp
from medfaq.retriever.trained_models import FAQ_INDEX, MPNET_BIENCODER_MODEL, encoded_by
from tests.conftest import CONSUMER_QUESTIONS, FAQ_ROWS, write_jsonl

QUESTIONS = [question for question, _ in CONSUMER_QUESTIONS] + ["what is the capital of france"]


def medfaq(*args: object):
    return CliRunner().invoke(app, [str(arg) for arg in args])


def search_all(tmp_path: Path) -> list[dict]:
    """Every question of `QUESTIONS` searched in the set-up index (the default one), in one batch: its hits, scores,
    confidence and abstentions (all but the timings)."""
    queries = write_jsonl(tmp_path / "queries.jsonl", [{"id": f"q{n}", "question": q} for n, q in enumerate(QUESTIONS)])
    result = medfaq("search", "--queries", queries, "--output", "-", "--encoder-backend", "torch", "--abstain")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    return [{key: value for key, value in row.items() if key != "timings_ms"} for row in rows]


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tiny_encoder_dir) -> tuple[Path, list[dict]]:
    """A home where the set-up trained its encoder (the tiny random one, with a training config and a threshold) and
    encoded the MedQuAD index with it, the reranker's decision recorded beside the index; its export and the
    results of searching it."""
    from medfaq.index.storage import read_manifest
    from medfaq.retriever.decisions.abstention import ModelThreshold
    from medfaq.retriever.training.config import EncoderTrainConfig

    root = tmp_path_factory.mktemp("gpu")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MEDFAQ_HOME", str(root / "home"))
        encoder = Path(shutil.copytree(tiny_encoder_dir, models_dir() / MPNET_BIENCODER_MODEL))
        EncoderTrainConfig(model_type="biencoder", task="faq", loss="contrastive", init="mpnet").save(encoder)
        ModelThreshold(0.5, "dense@raw", "top cosine", str(encoder), "none", {}, {}).save(encoder)
        (encoder / "medfaq-onnx").mkdir(exist_ok=True)  # made again where it runs: it does not travel
        (encoder / "medfaq-onnx" / "model.onnx").write_bytes(b"graph")
        index = indexes_dir() / FAQ_INDEX
        built = medfaq(
            "index", "build", write_jsonl(root / "faqs.jsonl", FAQ_ROWS), "--encoder", encoder, "--out", index
        )
        assert built.exit_code == 0, built.output
        record = {
            "on": False,
            "decided": utc_timestamp(),
            "reranker": str(models_dir() / RERANKER.model),
            "encoder_fingerprint": read_manifest(index).encoder_fingerprint,
        }
        (index / "reranker.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        results = search_all(root)
        result = medfaq("models", "export", root / "models.tar")
        assert result.exit_code == 0, result.output
        assert f"models/{MPNET_BIENCODER_MODEL}, biencoder" in result.stdout and f"indexes/{FAQ_INDEX}" in result.stdout
    return root / "models.tar", results


def test_a_model_file_imported_into_an_empty_home_searches_the_same(tmp_path, exported):
    from medfaq.retriever.decisions.reranker_choice import decided_for
    from medfaq.retriever.pipeline_file import read_config

    file, results = exported
    shutil.rmtree(file.parent / "home")  # nothing may still point into the home it was exported from
    listed = medfaq("models", "list", file)
    assert listed.exit_code == 0 and "abstains below 0.5000 (dense@raw)" in listed.stdout, listed.output
    assert "reranker off" in listed.stdout
    with tarfile.open(file) as archive:
        names = archive.getnames()
    assert names[0] == "manifest.json" and not any("medfaq-onnx" in name for name in names)

    imported = medfaq("models", "import", file)
    assert imported.exit_code == 0, imported.output
    assert imported.stdout.count("installed: ") == 2
    assert search_all(tmp_path) == results
    index, encoder = indexes_dir() / FAQ_INDEX, models_dir() / MPNET_BIENCODER_MODEL
    assert encoded_by(index, encoder)  # `medfaq setup` finds its encoder and index ready
    assert decided_for(index, models_dir() / RERANKER.model)  # the decision holds for this home's reranker
    assert all(origin.startswith(str(medfaq_home())) for origin in read_config(index).inherited_thresholds.values())
    again = medfaq("models", "import", file)
    assert again.exit_code == 0 and again.stdout.count("unchanged: ") == 2, again.output
    here = medfaq("models", "list").stdout
    assert f"models/{MPNET_BIENCODER_MODEL}, biencoder" in here and f"indexes/{FAQ_INDEX}, index" in here


def test_export_ships_the_set_up_models_and_with_all_every_trained_one(tmp_path):
    from medfaq.retriever.training.config import EncoderTrainConfig

    assert "nothing to export" in medfaq("models", "export", tmp_path / "none.tar").stderr
    for name in ("biencoder-faq-quick", "my-encoder", "half-trained"):
        (models_dir() / name).mkdir(parents=True)
        EncoderTrainConfig(model_type="biencoder", task="faq", loss="contrastive").save(models_dir() / name)
    (models_dir() / "biencoder-faq-quick" / "config.json").write_text("{}", encoding="utf-8")
    (models_dir() / "my-encoder" / "config.json").write_text("{}", encoding="utf-8")
    default = medfaq("models", "export", tmp_path / "setup.tar.gz")
    assert default.exit_code == 0 and "models/biencoder-faq-quick" in default.stdout, default.output
    assert "my-encoder" not in default.stdout
    everything = medfaq("models", "export", "--all", tmp_path / "all.tar.xz").stdout
    assert "models/my-encoder, biencoder" in everything and "half-trained" not in everything
    listed = medfaq("models", "list", tmp_path / "all.tar.xz").stdout
    assert "models/biencoder-faq-quick" in listed and "models/my-encoder" in listed


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under `root` with its bytes (None for a folder)."""
    return {str(path.relative_to(root)): None if path.is_dir() else path.read_bytes() for path in root.rglob("*")}


@pytest.fixture
def lived_in() -> Path:
    """A home that already holds another model, and a model of the file's name that differs from the file's."""
    for name in ("biencoder-faq-quick", MPNET_BIENCODER_MODEL):
        (models_dir() / name).mkdir(parents=True)
        (models_dir() / name / "config.json").write_text("{}", encoding="utf-8")
    return medfaq_home()


def test_setup_from_a_file_refuses_a_different_model_unless_forced(lived_in, exported):
    file, _ = exported
    before = snapshot(lived_in)
    dry = medfaq("setup", "--from", file, "--dry-run")
    assert dry.exit_code == 0 and "refused: differs" in dry.stdout and "would install" in dry.stdout, dry.output
    refused = medfaq("setup", "--from", file)
    assert refused.exit_code == 2 and refused.stderr.count("\n") == 1, refused.output
    assert f"models/{MPNET_BIENCODER_MODEL} already in " in refused.stderr and "--force" in refused.stderr
    assert snapshot(lived_in) == before
    forced = medfaq("models", "import", file, "--force")
    assert forced.exit_code == 0 and "replaced: " in forced.stdout, forced.output
    assert (models_dir() / MPNET_BIENCODER_MODEL / "modules.json").is_file()
    assert (models_dir() / "biencoder-faq-quick" / "config.json").read_text() == "{}"


def rewritten(source: Path, out: Path, change: Callable[[dict], None] = lambda manifest: None, extra=()) -> Path:
    """A copy of the model file `source` with its manifest changed by `change` and `extra` (name, bytes) members."""
    with tarfile.open(source) as archive, tarfile.open(out, "w") as copy:
        for member in archive:
            data = archive.extractfile(member).read()
            if member.name == "manifest.json":
                manifest = json.loads(data)
                change(manifest)
                data = json.dumps(manifest).encode()
                member.size = len(data)
            copy.addfile(member, io.BytesIO(data))
        for name, data in extra:
            member = tarfile.TarInfo(name)
            member.size = len(data)
            copy.addfile(member, io.BytesIO(data))
    return out


def flipped(source: Path, out: Path) -> Path:
    """`source` with one byte of the encoder's weights changed."""
    shutil.copy(source, out)
    with tarfile.open(out) as archive:
        weights = next(member for member in archive if member.name.endswith(".safetensors"))
    with out.open("r+b") as handle:
        handle.seek(weights.offset_data + weights.size // 2)
        byte = handle.read(1)
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([byte[0] ^ 0xFF]))
    return out


def truncated(source: Path, out: Path) -> Path:
    out.write_bytes(source.read_bytes()[: source.stat().st_size // 2])
    return out


def newer(manifest: dict) -> None:
    manifest["format_version"] += 1


def foreign_manifest(manifest: dict) -> None:
    manifest["format"] = "someone-elses-models"


def plain_tar(source: Path, out: Path) -> Path:
    with tarfile.open(out, "w") as archive:
        archive.add(source, "models.bin")
    return out


BAD_FILES = {
    "a changed byte": (flipped, "is damaged: models/biencoder-mpnet-faq-quick/model.safetensors does not match"),
    "a truncated file": (truncated, "is damaged or truncated"),
    "not an archive": (lambda source, out: out.write_text("hello\n") and out, "not a readable tar archive"),
    "an archive without a manifest": (plain_tar, "does not start with a manifest.json"),
    "a foreign manifest": (lambda s, o: rewritten(s, o, foreign_manifest), "is not a medfaq-models manifest"),
    "a newer format": (lambda s, o: rewritten(s, o, newer), "is in model file format 2, written by medfaq"),
    "a member outside its folders": (
        lambda s, o: rewritten(s, o, extra=[("models/../../evil.txt", b"x")]),
        "holds a member outside its folders ('models/../../evil.txt')",
    ),
    "a link": (
        lambda s, o: rewritten(s, o, extra=[("models/x/link", b"")]) and _as_link(o, "models/x/link"),
        "holds a link or special file",
    ),
}


def _as_link(file: Path, name: str) -> Path:
    """`file` with its member `name` turned into a symbolic link to /etc/passwd."""
    with tarfile.open(file) as archive:
        members = [(member, archive.extractfile(member).read()) for member in archive]
    with tarfile.open(file, "w") as archive:
        for member, data in members:
            if member.name == name:
                member.type, member.linkname, data = tarfile.SYMTYPE, "/etc/passwd", b""
            archive.addfile(member, io.BytesIO(data))
    return file


@pytest.mark.parametrize("case", BAD_FILES)
def test_a_bad_model_file_is_one_line_and_changes_nothing(tmp_path, lived_in, exported, case):
    make, message = BAD_FILES[case]
    file = make(exported[0], tmp_path / "bad.tar")
    before = snapshot(lived_in)
    for command in (("models", "import", file, "--force"), ("setup", "--from", file)):
        result = medfaq(*command)
        assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.output
        assert result.stderr.startswith("error: ") and message in result.stderr, result.stderr
        assert snapshot(lived_in) == before
    assert not (tmp_path / "evil.txt").exists() and not (lived_in.parent / "evil.txt").exists()
