"""Index writes never lose data (file lock, re-read under the lock, stale saves refused), readers can poll the
index version, and every bad input of the index commands is one `error: ...` line, exit 2, the index untouched."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from medfaq.app.cli import app
from medfaq.common.runtime import MedfaqError
from medfaq.index.faq_index import FaqIndex
from medfaq.index.lock import write_lock
from medfaq.index.records import FaqRecord
from medfaq.index.storage import disk_version
from tests.conftest import FAQ_ROWS, write_jsonl

runner = CliRunner()
REPO = Path(__file__).resolve().parents[1]


def medfaq(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def snapshot(directory: Path) -> dict[str, str]:
    """sha256 of every file under `directory`: the index is byte-identical when two snapshots are equal."""
    return {
        str(f.relative_to(directory)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(directory.rglob("*"))
        if f.is_file()
    }


def assert_one_line_error(result, pattern: str) -> None:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert pattern in lines[0], lines[0]
    assert "Traceback" not in result.stderr


def tiny_encoder_variant(tmp_path: Path, tiny_bert_dir: Path, hidden: int, seed: int) -> Path:
    """A sentence-transformers directory like the tiny encoder but with `hidden` dimensions and weights of `seed`."""
    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_bert_dir))
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=hidden,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=128,
    )
    bert = tmp_path / f"bert-{hidden}-{seed}"
    BertModel(config).save_pretrained(bert)
    tokenizer.save_pretrained(bert)
    transformer = models.Transformer(str(bert), max_seq_length=64)
    pooling = models.Pooling(transformer.get_embedding_dimension(), pooling_mode="mean")
    out = tmp_path / f"encoder-{hidden}-{seed}"
    SentenceTransformer(modules=[transformer, pooling, models.Normalize()], device="cpu").save(str(out))
    return out


class SlowEncoder:
    """The tiny encoder, sleeping before each encode call so that another write starts while this one runs."""

    def __init__(self, encoder, delay: float, started: threading.Event) -> None:
        self.inner, self.delay, self.started = encoder, delay, started
        self.name, self.dim, self.fingerprint = encoder.name, encoder.dim, encoder.fingerprint

    def encode(self, texts: list[str]) -> np.ndarray:
        self.started.set()
        time.sleep(self.delay)
        return self.inner.encode(texts)


def run_beside(first, second) -> list[BaseException]:
    """Run `first` in a thread, start `second` once `first` is inside its write, and return any errors raised."""
    errors: list[BaseException] = []

    def guarded(call):
        try:
            call()
        except BaseException as error:  # noqa: BLE001 - collected and asserted by the test
            errors.append(error)

    thread = threading.Thread(target=guarded, args=(first,))
    thread.start()
    guarded(second)
    thread.join(timeout=120)
    return errors


# ---- writes that never lose data ------------------------------------------------------------------------------


def test_two_concurrent_adds_keep_the_union(index_dir, tiny_encoder):
    started = threading.Event()
    slow = SlowEncoder(tiny_encoder, 1.0, started)
    first = [FaqRecord(f"a{i}", f"Is flu vaccine number {i} safe?") for i in range(3)]
    second = [FaqRecord(f"b{i}", f"How long does cough {i} last?") for i in range(4)]

    def second_add():
        assert started.wait(60)
        FaqIndex.add_to(index_dir, second, encoder=tiny_encoder, progress=False, timeout=60)

    errors = run_beside(lambda: FaqIndex.add_to(index_dir, first, encoder=slow, progress=False), second_add)
    assert not errors
    ids = {record.id for record in FaqIndex.load(index_dir).records()}
    assert ids == {row["id"] for row in FAQ_ROWS} | {r.id for r in first + second}
    reloaded = FaqIndex.load(index_dir, encoder=tiny_encoder)
    assert len(reloaded.store) == len(reloaded.bm25) == 13
    assert reloaded.search_dense(["How long does cough 2 last?"], 1)[0][0][0] == "b2"


def test_add_beside_a_delete_keeps_both_changes(index_dir, tiny_encoder):
    started = threading.Event()
    slow = SlowEncoder(tiny_encoder, 1.0, started)
    new = [FaqRecord("n1", "Does ibuprofen raise blood pressure?")]

    def delete():
        assert started.wait(60)
        FaqIndex.delete_from(index_dir, ["f3"], timeout=60)

    errors = run_beside(lambda: FaqIndex.add_to(index_dir, new, encoder=slow, progress=False), delete)
    assert not errors
    index = FaqIndex.load(index_dir)
    assert "n1" in index and "f3" not in index and len(index) == 6
    assert [faq_id for faq_id, _ in index.search_bm25(["shingles treated"], 5)[0]] == []


def test_saving_an_index_changed_by_another_write_is_refused(index_dir, tiny_encoder):
    stale = FaqIndex.load(index_dir, encoder=tiny_encoder)
    FaqIndex.delete_from(index_dir, ["f1"])
    before = snapshot(index_dir)
    stale.editor().add([FaqRecord("n1", "Is a fever dangerous?")], progress=False)
    with pytest.raises(MedfaqError, match="changed by another write"):
        stale.save(index_dir)
    assert snapshot(index_dir) == before


def test_version_changes_with_every_write_and_is_cheap_to_poll(index_dir, tiny_encoder):
    index = FaqIndex.load(index_dir)
    assert index.version == disk_version(index_dir) and index.version.startswith("1-")
    updated, _ = FaqIndex.delete_from(index_dir, ["f2"])
    assert disk_version(index_dir) == updated.version != index.version
    assert updated.version.startswith("2-") and updated.manifest.generation == 2
    assert disk_version(index_dir.parent / "missing") is None


def test_readers_never_see_a_half_written_index(index_dir):
    """Loads running while deletes are saved see the old or the new index, never a mix or an error."""
    done, seen, errors = threading.Event(), set(), []

    def read():
        while not done.is_set():
            try:
                index = FaqIndex.load(index_dir)
                assert len(index) == len(index.store) == index.manifest.counts["records"]
                seen.add(len(index))
            except BaseException as error:  # noqa: BLE001 - collected and asserted below
                errors.append(error)

    reader = threading.Thread(target=read)
    reader.start()
    for faq_id in ("f1", "f2", "f3", "f4"):
        FaqIndex.delete_from(index_dir, [faq_id])
        time.sleep(0.05)
    done.set()
    reader.join(timeout=60)
    assert not errors and seen and seen <= {2, 3, 4, 5, 6}


def test_a_load_whose_files_vanish_under_a_save_reads_the_new_index(index_dir, monkeypatch):
    """A save that swaps the directory between a reader's checks and its reads (a file found, then gone when
    opened) makes the load read the new index, not fail with an OSError."""
    import medfaq.index.storage as storage

    checksum, raced = storage._sha256, []

    def vanishing(file: Path) -> str:
        if not raced:
            raced.append(file)
            FaqIndex.delete_from(index_dir, ["f1"])
            raise FileNotFoundError(2, "No such file or directory", str(file))
        return checksum(file)

    monkeypatch.setattr(storage, "_sha256", vanishing)
    index = FaqIndex.load(index_dir)
    assert raced and "f1" not in index and index.version == disk_version(index_dir)


def test_a_load_that_races_a_save_at_every_attempt_reads_under_the_lock(index_dir, monkeypatch):
    """When every optimistic read races a save, the last read holds the write lock: a consistent index, never the
    mix of an old manifest and newer files."""
    import medfaq.index.lock as lock
    import medfaq.index.storage as storage

    checksum, doomed = storage._sha256, [f"f{number}" for number in range(1, storage.LOAD_ATTEMPTS + 1)]

    def racing(file: Path) -> str:
        locked = index_dir.resolve() in lock._held.__dict__.get("paths", set())
        if file == index_dir / storage.KEYS and doomed and not locked:
            FaqIndex.delete_from(index_dir, [doomed.pop(0)])  # one save during each optimistic read
        return checksum(file)

    monkeypatch.setattr(storage, "_sha256", racing)
    index = FaqIndex.load(index_dir)
    assert not doomed and index.version == disk_version(index_dir)
    assert len(index) == len(index.store) == index.manifest.counts["records"] == 6 - storage.LOAD_ATTEMPTS


def test_a_waiting_write_says_so_and_fails_after_its_timeout(index_dir):
    """A real `medfaq index delete` process against a lock held here: one waiting line, one error line, no change."""
    before = snapshot(index_dir)
    command = [sys.executable, "-m", "medfaq.app", "index", "delete", str(index_dir), "f1", "--lock-timeout", "0.5"]
    with write_lock(index_dir):
        result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("warning: waiting for the lock on") and "held by another write" in lines[0]
    assert lines[1].startswith("error: ") and "still locked by another write after 0.5 s" in lines[1]
    assert snapshot(index_dir) == before


def test_a_waiting_write_goes_on_when_the_lock_is_released(index_dir):
    holder_ready, release = threading.Event(), threading.Event()

    def hold():
        with write_lock(index_dir):
            holder_ready.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holder_ready.wait(30)
    threading.Timer(0.5, release.set).start()
    index, removed = FaqIndex.delete_from(index_dir, ["f1"], timeout=30)
    holder.join()
    assert removed == 1 and "f1" not in FaqIndex.load(index_dir)


# ---- encoder dimension and fingerprint --------------------------------------------------------------------------


def edit_manifest(index_dir: Path, **changes) -> None:
    path = index_dir / "manifest.json"
    manifest = json.loads(path.read_text(encoding="utf-8"))
    for key, value in changes.items():
        if value is None:
            manifest.pop(key, None)
        else:
            manifest[key] = value
    path.write_text(json.dumps(manifest), encoding="utf-8")


def test_manifest_records_dimension_and_fingerprint(index_dir, tiny_encoder):
    manifest = json.loads((index_dir / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["dimension"] == tiny_encoder.dim == 32
    assert manifest["encoder_fingerprint"] == tiny_encoder.fingerprint and len(tiny_encoder.fingerprint) == 64


@pytest.mark.parametrize(("hidden", "pattern"), [(16, "gives 16-d vectors but index"), (32, "is not the model index")])
def test_an_encoder_other_than_the_one_that_built_the_index_is_refused(
    tmp_path, index_dir, tiny_bert_dir, tiny_encoder, hidden, pattern
):
    other = tiny_encoder_variant(tmp_path, tiny_bert_dir, hidden, seed=7)
    edit_manifest(index_dir, encoder=str(other))  # the manifest names another model than the one of its vectors
    before = snapshot(index_dir)
    new = write_jsonl(tmp_path / "new.jsonl", [{"id": "n1", "question": "Flu?"}])
    # on torch: a model never used before is not exported to ONNX Runtime first (a warning line of its own)
    result = medfaq("index", "add", index_dir, new, "--encoder-backend", "torch")
    assert_one_line_error(result, pattern)
    assert str(other) in result.stderr and (tiny_encoder.fingerprint[:12] in result.stderr or hidden == 16)
    assert snapshot(index_dir) == before


def test_a_manifest_dimension_that_does_not_match_the_vectors_is_one_line(index_dir):
    edit_manifest(index_dir, dimension=128)
    result = medfaq("search", "--index", index_dir, "--mode", "bm25", "shingles")
    assert_one_line_error(result, "its manifest names 128-d encoder")
    assert "but its vectors are 32-d" in result.stderr


def test_an_index_built_before_fingerprints_still_loads_and_grows(tmp_path, index_dir, tiny_encoder):
    edit_manifest(index_dir, encoder_fingerprint=None, generation=None, sources=None)
    result = medfaq("index", "info", index_dir, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["sources"] == {"(none)": 6}
    index, added = FaqIndex.add_to(index_dir, [FaqRecord("n1", "Is a fever dangerous?")], progress=False)
    assert added == 1 and index.manifest.encoder_fingerprint == ""  # the old index keeps its dimension and name check
    assert FaqIndex.load(index_dir, encoder=tiny_encoder).search_dense(["Is a fever dangerous?"], 1)[0][0][0] == "n1"


# ---- bad inputs of the index commands ---------------------------------------------------------------------------


BAD_COLLECTIONS = {
    "empty.jsonl": (b"", False, "holds no FAQs to index (the file is empty)"),
    "header-only.csv": (b"id,question,answer\n", False, "holds no FAQs to index"),
    "all-bad.jsonl": (
        b'{"id": "x"}\nnot json\n',
        True,
        "2 malformed lines skipped (first: [1, 2]), none left",
    ),
    "latin1.jsonl": (b'{"id": "a", "question": "ok"}\n{"id": "b", "question": "caf\xe9?"}\n', False, ":2: not UTF-8"),
    "surrogate.jsonl": (b'{"id": "a", "question": "caf\\udce9?"}\n', False, ":1: invalid UTF-8 (a lone surrogate"),
    "surrogate-skipped.jsonl": (
        b'{"id": "a", "question": "caf\\udce9?"}\n',
        True,
        "(1 malformed lines skipped (first: [1]), none left)",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_COLLECTIONS))
def test_build_of_a_bad_collection_leaves_the_previous_index_byte_identical(
    tmp_path, index_dir, tiny_encoder_dir, name
):
    content, skip_bad, pattern = BAD_COLLECTIONS[name]
    collection = tmp_path / name
    collection.write_bytes(content)
    before = snapshot(index_dir)
    args = ["index", "build", collection, "--out", index_dir, "--encoder", tiny_encoder_dir]
    result = medfaq(*args, *(["--skip-bad"] if skip_bad else []))
    assert_one_line_error(result, pattern)
    assert snapshot(index_dir) == before


def test_skip_bad_counts_invalid_utf8_lines_and_keeps_the_rest(tmp_path, tiny_encoder_dir):
    collection = tmp_path / "mixed.jsonl"
    collection.write_bytes(
        b'{"id": "a", "question": "Is flu contagious?"}\n{"id": "b", "question": "caf\xe9?"}\n'
        b'{"id": "c", "question": "caf\\udce9?"}\n{"id": "d", "question": "Emoji \\ud83d\\ude00 ok?"}\n'
    )
    result = medfaq(
        "index", "build", collection, "--out", tmp_path / "idx", "--encoder", tiny_encoder_dir, "--skip-bad"
    )
    assert result.exit_code == 0, result.output
    assert "2 FAQs" in result.stderr and "2 malformed lines skipped (first: [2, 3])" in result.stderr
    assert sorted(r.id for r in FaqIndex.load(tmp_path / "idx").records()) == ["a", "d"]


@pytest.mark.parametrize(
    ("extra", "pattern"),
    [
        (["--batch-size", "0"], "Invalid value for '--batch-size'"),
        (["--workers", "0"], "Invalid value for '--workers'"),
        (["--shards", "0"], "Invalid value for '--shards'"),
        (["--lock-timeout", "nan"], "--lock-timeout must be a number of seconds >= 0"),
        (["--lock-timeout", "-1"], "--lock-timeout must be a number of seconds >= 0"),
        (["--kind", "tree"], "unknown --kind 'tree'"),
    ],
)
def test_bad_numeric_and_choice_options_of_build(tmp_path, index_dir, tiny_encoder_dir, extra, pattern):
    before = snapshot(index_dir)
    collection = write_jsonl(tmp_path / "faqs.jsonl", FAQ_ROWS)
    result = medfaq("index", "build", collection, "--out", index_dir, "--encoder", tiny_encoder_dir, *extra)
    assert_one_line_error(result, pattern)
    assert snapshot(index_dir) == before


def test_an_encoder_directory_that_is_not_a_model_is_one_line(tmp_path, index_dir):
    not_a_model = tmp_path / "notes"
    not_a_model.mkdir()
    (not_a_model / "readme.txt").write_text("hello", encoding="utf-8")
    before = snapshot(index_dir)
    collection = write_jsonl(tmp_path / "faqs.jsonl", FAQ_ROWS)
    result = medfaq("index", "build", collection, "--out", index_dir, "--encoder", not_a_model)
    assert_one_line_error(result, "is not a sentence-transformers or Hugging Face model directory")
    assert snapshot(index_dir) == before


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        (("delete", "{index}", "nope"), "unknown FAQ id(s): 'nope'"),
        (("delete", "{index}", "f1", "--lock-timeout", "inf"), "--lock-timeout must be"),
        (("add", "{index}", "{dup}"), "duplicate FAQ ids already in the index: 'f1'"),
        (("add", "{missing}", "{dup}"), "index directory not found"),
        (("delete", "{missing}", "f1"), "index directory not found"),
        (("delete", "{absent}", "f1"), "index directory not found"),
        (("add", "{absent}", "{dup}"), "index directory not found"),
        (("migrate", "{index}", "--out", "{index}", "--shards", "0"), "Invalid value for '--shards'"),
    ],
)
def test_bad_add_delete_and_migrate_change_nothing(tmp_path, index_dir, args, pattern):
    dup = write_jsonl(tmp_path / "dup.jsonl", [{"id": "f1", "question": "Again?"}])
    values = {"index": index_dir, "dup": dup, "missing": tmp_path / "missing" / "idx", "absent": tmp_path / "absent"}
    before = snapshot(index_dir)
    result = medfaq("index", *(str(a).format(**values) for a in args))
    assert_one_line_error(result, pattern)
    assert snapshot(index_dir) == before
    assert not (tmp_path / "missing").exists() and not (tmp_path / ".absent.lock").exists()


def test_index_info_and_bm25_work_without_model_libraries(index_dir):
    """`index info` reads the manifest only; neither it nor a BM25 load imports torch or sentence-transformers."""
    code = (
        "import sys\n"
        "from medfaq.index.faq_index import FaqIndex\n"
        "from medfaq.index.storage import index_info\n"
        f"info = index_info({str(index_dir)!r})\n"
        f"hits = FaqIndex.load({str(index_dir)!r}).search_bm25(['shingles treated'], 1)\n"
        "heavy = [m for m in ('torch', 'transformers', 'sentence_transformers') if m in sys.modules]\n"
        "print(info['counts']['records'], hits[0][0][0], heavy)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["6", "f3", "[]"]
