from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest

from medfaq.common.runtime import MedfaqError
from medfaq.index.bm25_store import Bm25Index
from medfaq.index.faiss_store import FaissStore
from medfaq.index.faq_index import FaqIndex
from medfaq.index.records import FaqRecord

NEW = [FaqRecord("n1", "Does ibuprofen raise blood pressure?"), FaqRecord("n2", "Can children take aspirin?")]


@pytest.fixture
def saved_index(tmp_path, faq_records, tiny_encoder):
    directory = tmp_path / "idx"
    FaqIndex.build(faq_records, tiny_encoder, progress=False).save(directory)
    return directory


@pytest.mark.parametrize("kind", ["flat", "ivf", "hnsw"])
def test_build_add_delete_save_load_round_trip(tmp_path, faq_records, tiny_encoder, kind):
    index = FaqIndex.build(faq_records, tiny_encoder, kind=kind, progress=False)
    query = [faq_records[2].question]
    assert index.search_dense(query, 1)[0][0][0] == "f3"  # its own question is the nearest vector
    assert index.search_bm25(query, 1)[0][0][0] == "f3"
    index.editor().add(NEW, progress=False)
    assert index.editor().delete(["f3", "n2"]) == 2
    index.save(tmp_path / "idx")
    loaded = FaqIndex.load(tmp_path / "idx", tiny_encoder)
    assert sorted(r.id for r in loaded.records()) == ["f1", "f2", "f4", "f5", "f6", "n1"]
    assert len(loaded.store) == 6 and len(loaded.bm25) == 6
    for ranking in loaded.search_dense(query, 10)[0], loaded.search_bm25(query, 10)[0]:
        assert "f3" not in {doc for doc, _ in ranking}
    assert loaded.search_dense([NEW[0].question], 1)[0][0][0] == "n1"
    assert loaded.manifest.counts == {"records": 6, "vectors": 6, "bm25": 6, "phrasings": 0}
    assert loaded.manifest.backend["kind"] == kind


def test_allowed_ids_filter_dense_and_bm25(faq_records, tiny_encoder):
    index = FaqIndex.build(faq_records, tiny_encoder, progress=False)
    dense = index.search_dense(["alcohol amoxicillin"], 10, allowed_ids=["f2", "f4"])[0]
    assert {doc for doc, _ in dense} == {"f2", "f4"}
    assert index.search_bm25(["amoxicillin"], 10, allowed_ids=["f2"])[0] == []
    assert index.ids_where(source="") == [r.id for r in faq_records]


def test_hnsw_deletes_are_tombstones_until_compaction(tiny_encoder):
    store = FaissStore(dim=8, kind="hnsw")
    vectors = np.eye(8, dtype=np.float32)
    store.add(np.arange(8), vectors)
    assert store.delete(np.array([0, 99])) == 1  # unknown keys are ignored
    assert len(store) == 7 and store.tombstones == {0}
    _, keys = store.search(vectors[:1], 8)
    assert 0 not in keys[0]
    store.delete(np.array([1]))  # 2 of 8 deleted > 20%: the graph is rebuilt without them
    assert store.tombstones == set() and store.index.ntotal == 6


def test_duplicate_and_unknown_ids(faq_records, tiny_encoder):
    index = FaqIndex.build(faq_records, tiny_encoder, progress=False)
    with pytest.raises(MedfaqError, match="already in the index: 'f1'"):
        index.editor().add([FaqRecord("f1", "again?")])
    with pytest.raises(MedfaqError, match="unknown FAQ id.*'zz'"):
        index.editor().delete(["zz"])
    with pytest.raises(MedfaqError, match="duplicate FAQ ids"):
        FaqIndex.build(faq_records + faq_records[:1], tiny_encoder, progress=False)


def test_load_refuses_other_encoder_and_damaged_directories(tmp_path, saved_index):
    with pytest.raises(MedfaqError, match="built with encoder .* not 'minilm'.*rebuild"):
        FaqIndex.load(saved_index, "minilm")
    with pytest.raises(MedfaqError, match="index directory not found"):
        FaqIndex.load(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(MedfaqError, match="not a medfaq index"):
        FaqIndex.load(tmp_path / "empty")
    vectors = saved_index / "vectors" / "vectors.faiss"
    vectors.write_bytes(vectors.read_bytes()[:-8])
    with pytest.raises(MedfaqError, match="checksum mismatch for vectors/vectors.faiss"):
        FaqIndex.load(saved_index)
    (saved_index / "manifest.json").write_text("{broken")
    with pytest.raises(MedfaqError, match="corrupt manifest.json"):
        FaqIndex.load(saved_index)


def test_save_refuses_to_replace_a_foreign_directory(tmp_path, faq_records, tiny_encoder):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.txt").write_text("mine")
    with pytest.raises(MedfaqError, match="not a medfaq index"):
        FaqIndex.build(faq_records, tiny_encoder, progress=False).save(tmp_path / "docs")


def snapshot(directory):
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("failure", [KeyboardInterrupt, OSError])
def test_crash_during_add_and_save_leaves_previous_index_intact(monkeypatch, saved_index, tiny_encoder, failure):
    before = snapshot(saved_index)
    index = FaqIndex.load(saved_index, tiny_encoder)

    def crash(*args, **kwargs):
        raise failure("simulated crash")

    with monkeypatch.context() as patch:  # fails while encoding the new FAQs: nothing changes in memory
        patch.setattr(tiny_encoder, "encode", crash)
        with pytest.raises(failure):
            index.editor().add(NEW, progress=False)
    assert len(index) == 6 and "n1" not in index
    index.editor().add(NEW, progress=False)
    with monkeypatch.context() as patch:  # fails half-way through writing the new version
        patch.setattr(Bm25Index, "save", crash)
        with pytest.raises(failure):
            index.save(saved_index)
    assert snapshot(saved_index) == before
    leftovers = sorted(p.name for p in saved_index.parent.iterdir())
    assert leftovers == [".idx.lock", "idx"]  # no staging directory left behind (the lock file stays)
    assert len(FaqIndex.load(saved_index)) == 6


def test_sidecar_json_survives_saves(saved_index, tiny_encoder):
    (saved_index / "pipeline.json").write_text(json.dumps({"mode": "dense"}))
    index = FaqIndex.load(saved_index, tiny_encoder)
    index.editor().delete(["f1"])
    index.save(saved_index)
    assert json.loads((saved_index / "pipeline.json").read_text()) == {"mode": "dense"}
    assert len(FaqIndex.load(saved_index)) == 5


def test_question_plus_answer_fields(faq_records, tiny_encoder):
    index = FaqIndex.build(faq_records, tiny_encoder, fields="question+answer", progress=False)
    assert index.search_bm25(["antiviral"], 1)[0][0][0] == "f3"  # the word is only in f3's answer
    with pytest.raises(MedfaqError, match="unknown --fields"):
        FaqIndex.build(faq_records, tiny_encoder, fields="answer", progress=False)


def test_a_loaded_index_parses_only_the_records_it_returns(monkeypatch, saved_index, tiny_encoder):
    from medfaq.index.record_table import RecordFile

    parsed = []
    record = RecordFile.record
    monkeypatch.setattr(RecordFile, "record", lambda self, row: parsed.append(row) or record(self, row))
    index = FaqIndex.load(saved_index, tiny_encoder)
    assert len(index) == 6 and "f3" in index and not parsed
    assert index.search_dense(["Is shingles treated?"], 2)[0][0][0] == "f3" and not parsed  # ids need no parsing
    assert index.get("f3").question == "How is shingles treated?" and len(parsed) == 1


def test_an_index_saved_without_offsets_loads_and_its_next_save_adds_them(saved_index, faq_records, tiny_encoder):
    manifest = json.loads((saved_index / "manifest.json").read_text())
    for name in ("records.offsets.npy", "records.ids"):  # the layout before record offsets were written
        (saved_index / name).unlink()
        del manifest["checksums"][name]
    records = saved_index / "records.jsonl"
    lines = records.read_text().splitlines()
    last = json.loads(lines[-1])  # a line whose id does not lead, at the end of a file without a final newline
    lines[-1] = json.dumps({"question": last.pop("question"), **last})
    records.write_text("\n".join(lines[:2] + [""] + lines[2:]))  # and a blank line
    manifest["checksums"]["records.jsonl"] = hashlib.sha256(records.read_bytes()).hexdigest()
    (saved_index / "manifest.json").write_text(json.dumps(manifest))
    index = FaqIndex.load(saved_index, tiny_encoder)
    assert [r.to_dict() for r in index.records()] == [r.to_dict() for r in faq_records]
    FaqIndex.delete_from(saved_index, ["f2"])
    FaqIndex.add_to(saved_index, NEW, tiny_encoder, progress=False)
    assert (saved_index / "records.offsets.npy").is_file()
    reloaded = FaqIndex.load(saved_index, tiny_encoder)
    expected = [r for r in faq_records if r.id != "f2"] + NEW
    assert [r.to_dict() for r in reloaded.records()] == [r.to_dict() for r in expected]
    assert reloaded.search_bm25(["ibuprofen"], 1)[0][0][0] == "n1"


def test_records_cut_short_after_loading_are_a_one_line_error(saved_index, tiny_encoder):
    index = FaqIndex.load(saved_index, tiny_encoder)
    records = saved_index / "records.jsonl"
    records.write_bytes(records.read_bytes()[:100])  # damaged in place, behind the loaded index
    with pytest.raises(MedfaqError, match=r"is corrupt \(records.jsonl line 6 is cut short\); rebuild it"):
        index.get("f6")


def test_unchanged_files_are_verified_once_and_changed_ones_always(monkeypatch, saved_index):
    import medfaq.index.storage as storage
    import medfaq.index.verified as verified

    hashed = []
    checksum = storage._sha256
    monkeypatch.setattr(storage, "_sha256", lambda file: hashed.append(file.name) or checksum(file))
    FaqIndex.load(saved_index)  # saved just now: every file is hashed, and none trusted yet
    FaqIndex.load(saved_index)
    files = len(json.loads((saved_index / "manifest.json").read_text())["checksums"])
    assert len(hashed) == 2 * files
    monkeypatch.setattr(verified, "SETTLED_S", 0.0)  # as if the files were older
    FaqIndex.load(saved_index)
    FaqIndex.load(saved_index)
    assert len(hashed) == 3 * files
    records = saved_index / "records.jsonl"
    stat, data = records.stat(), records.read_bytes()
    records.write_bytes(data.replace(b"shingles", b"shingleZ", 1))  # same size, same mtime: the ctime changes
    os.utime(records, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(MedfaqError, match="checksum mismatch for records.jsonl; rebuild it"):
        FaqIndex.load(saved_index)
