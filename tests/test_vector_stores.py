"""Both vector backends (FAISS, Milvus Lite) through one parametrised suite; parity; resumable builds; GPU choice."""

from __future__ import annotations

import json

import faiss
import numpy as np
import pytest
from typer.testing import CliRunner

import medfaq.index.chunked_encoding as chunked_encoding
from medfaq.app.cli import app
from medfaq.common.runtime import MedfaqError, choose_device
from medfaq.eval.ann_bench import ann_comparison, index_vectors, synthetic_vectors
from medfaq.index.chunked_encoding import staging_dir
from medfaq.index.faiss_store import FaissStore
from medfaq.index.faq_index import FaqIndex
from medfaq.index.records import FaqRecord
from medfaq.index.vector_store import VectorStore, backend_class
from tests.conftest import CountingEncoder, assert_same_rankings

BACKENDS = ["faiss", "milvus"]
DIM = 16


def backend_options(backend: str, tmp_path) -> dict:
    return {"uri": str(tmp_path / "milvus.db")} if backend == "milvus" else {}


def new_store(backend: str, tmp_path, kind: str = "flat", dim: int = DIM) -> VectorStore:
    return backend_class(backend)(dim=dim, kind=kind, **backend_options(backend, tmp_path))


def reopen(store: VectorStore, backend: str, directory) -> VectorStore:
    store.save(directory)
    return backend_class(backend).load(directory, {"name": backend, "dim": store.dim, **store.backend_config()})


@pytest.fixture
def vectors() -> np.ndarray:
    return synthetic_vectors(40, DIM, seed=3, clusters=4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_add_search_delete_save_load(tmp_path, backend, kind, vectors):
    store = new_store(backend, tmp_path, kind)
    assert isinstance(store, VectorStore) and len(store) == 0
    assert (store.search(vectors[:1], 3)[1] == -1).all()  # an empty store finds nothing
    store.add(np.arange(100, 140), vectors)
    scores, keys = store.search(vectors[:5], 3)
    assert keys[:, 0].tolist() == [100, 101, 102, 103, 104]  # each vector finds itself first
    assert np.allclose(scores[:, 0], 1.0, atol=1e-5) and (np.diff(scores, axis=1) <= 1e-6).all()
    assert store.delete(np.array([100, 101, 999])) == 2 and len(store) == 38
    assert not {100, 101} & set(store.search(vectors[:2], 10)[1].ravel().tolist())
    loaded = reopen(store, backend, tmp_path / "vectors")
    assert len(loaded) == 38
    assert loaded.search(vectors[2:5], 3)[1].tolist() == store.search(vectors[2:5], 3)[1].tolist()
    with pytest.raises(MedfaqError, match="dimension"):
        store.add(np.arange(2), vectors[:2, :4])


@pytest.mark.parametrize("backend", BACKENDS)
def test_allowed_keys_filter(tmp_path, backend, vectors):
    store = new_store(backend, tmp_path)
    store.add(np.arange(40), vectors)
    allowed = np.array([5, 17, 30])
    scores, keys = store.search(vectors[:3], 5, allowed=allowed)
    assert all(set(row[row >= 0].tolist()) == {5, 17, 30} for row in keys)
    assert np.isneginf(scores[keys < 0]).all()
    assert (store.search(vectors[:1], 5, allowed=np.array([], dtype=np.int64))[1] == -1).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_faq_index_round_trip_and_source_filter(tmp_path, backend, faq_records, tiny_encoder):
    records = [
        FaqRecord.from_dict({**r.to_dict(), "source": "nih" if i % 2 else "cdc"}) for i, r in enumerate(faq_records)
    ]
    index = FaqIndex.build(
        records, tiny_encoder, backend=backend, backend_options=backend_options(backend, tmp_path), progress=False
    )
    allowed = index.ids_where(source="nih")
    hits = index.search_dense([records[0].question], 10, allowed_ids=allowed)[0]
    assert {faq_id for faq_id, _ in hits} == set(allowed) == {"f2", "f4", "f6"}
    editor = index.editor()
    editor.add([FaqRecord("n1", "Does ibuprofen raise blood pressure?", source="nih")], progress=False)
    editor.delete(["f2"])
    index.save(tmp_path / "idx")
    loaded = FaqIndex.load(tmp_path / "idx", tiny_encoder)
    assert loaded.manifest.backend["name"] == backend and loaded.manifest.counts["vectors"] == 6
    assert loaded.search_dense(["Does ibuprofen raise blood pressure?"], 1)[0][0][0] == "n1"
    assert {i for i, _ in loaded.search_dense(["x"], 10, allowed_ids=loaded.ids_where(source="nih"))[0]} == {
        "f4",
        "f6",
        "n1",
    }


def test_milvus_returns_the_same_top10_as_faiss_flat_on_5000_faqs(tmp_path):
    collection = synthetic_vectors(5000, 384, seed=7, clusters=50)
    queries = synthetic_vectors(25, 384, seed=7, clusters=50)
    keys = np.arange(5000, dtype=np.int64) * 3  # non-consecutive keys, like an index after deletes
    faiss_store, milvus_store = new_store("faiss", tmp_path, dim=384), new_store("milvus", tmp_path, dim=384)
    for store in faiss_store, milvus_store:
        store.add(keys, collection)
    faiss_scores, faiss_keys = faiss_store.search(queries, 10)
    milvus_scores, milvus_keys = milvus_store.search(queries, 10)
    assert np.array_equal(faiss_keys, milvus_keys)
    assert np.allclose(faiss_scores, milvus_scores, atol=1e-5)


def test_rebuilding_a_milvus_index_replaces_its_collection(tmp_path, faq_records, tiny_encoder):
    options = backend_options("milvus", tmp_path)
    first = FaqIndex.build(faq_records, tiny_encoder, backend="milvus", backend_options=options, progress=False)
    first.save(tmp_path / "idx")
    second = FaqIndex.build(faq_records[:3], tiny_encoder, backend="milvus", backend_options=options, progress=False)
    second.save(tmp_path / "idx")
    client = second.store.client
    assert not client.has_collection(first.store.collection) and client.has_collection(second.store.collection)
    assert len(FaqIndex.load(tmp_path / "idx")) == 3


def many_records(n: int) -> list[FaqRecord]:
    topics = ["asthma", "flu", "gout", "acne", "mumps", "lupus", "rabies"]
    return [FaqRecord(f"q{i}", f"What helps {topics[i % 7]} in case {i}?", source=f"s{i % 3}") for i in range(n)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_killed_build_resumes_where_it_stopped(tmp_path, monkeypatch, backend, tiny_encoder):
    monkeypatch.setattr(chunked_encoding, "ENCODE_CHUNK", 4)
    records, staging = many_records(18), tmp_path / "staging"  # 5 chunks
    options = backend_options(backend, tmp_path)
    build = dict(backend=backend, backend_options=options, progress=False, staging=staging)
    with pytest.raises(KeyboardInterrupt):  # killed while encoding the third chunk
        FaqIndex.build(records, CountingEncoder(tiny_encoder, fail_after=2), **build)
    progress = json.loads((staging / "progress.json").read_text())
    assert progress["chunks_done"] == 2 and len(list(staging.glob("chunk-*.npy"))) == 2
    resumed_encoder = CountingEncoder(tiny_encoder)
    resumed = FaqIndex.build(records, resumed_encoder, **build)
    assert resumed_encoder.calls == 3  # only the missing chunks were encoded
    uninterrupted = FaqIndex.build(records, tiny_encoder, backend=backend, backend_options=options, progress=False)
    queries = tiny_encoder.encode([r.question for r in records[::5]])
    assert_same_rankings(resumed.search_vectors(queries, 18), uninterrupted.search_vectors(queries, 18))
    with pytest.raises(MedfaqError, match="partial build of other texts"):
        FaqIndex.build(records[:10], tiny_encoder, **build)


def test_cli_resume_and_milvus_search(tmp_path, monkeypatch, faq_jsonl, tiny_encoder_dir):
    """`index build --resume` encodes only what a killed run left; `search` works unchanged on Milvus; `migrate`."""
    from medfaq.index.encoder import Encoder

    monkeypatch.setattr(chunked_encoding, "ENCODE_CHUNK", 2)
    calls: list[int] = []
    original = Encoder.encode

    def killed_after_two(self, texts, progress=False):
        if len(calls) == 2:
            raise RuntimeError("killed")
        calls.append(len(texts))
        return original(self, texts, progress)

    out, uri = tmp_path / "idx", tmp_path / "faqs.db"
    args = ["index", "build", faq_jsonl, "--out", out, "--encoder", tiny_encoder_dir, "--backend", "milvus"]
    args += ["--encoder-backend", "torch"]
    runner = CliRunner()
    monkeypatch.setattr(Encoder, "encode", killed_after_two)
    assert isinstance(runner.invoke(app, [str(a) for a in [*args, "--uri", uri]]).exception, RuntimeError)
    assert not out.exists() and staging_dir(out).is_dir()
    monkeypatch.setattr(Encoder, "encode", original)
    result = runner.invoke(app, [str(a) for a in [*args, "--uri", uri, "--resume"]])
    assert result.exit_code == 0, result.output
    assert not staging_dir(out).exists()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["backend"]["name"] == "milvus" and manifest["backend"]["uri"] == str(uri)
    found = runner.invoke(app, ["search", "--index", str(out), "--json", "--mode", "dense", "How is shingles treated?"])
    assert found.exit_code == 0 and json.loads(found.stdout)["hits"][0]["id"] == "f3"
    moved = runner.invoke(app, ["index", "migrate", str(out), "--out", str(out), "--backend", "faiss"])
    assert moved.exit_code == 0 and json.loads((out / "manifest.json").read_text())["backend"]["name"] == "faiss"
    found = runner.invoke(app, ["search", "--index", str(out), "--json", "--mode", "dense", "How is shingles treated?"])
    assert json.loads(found.stdout)["hits"][0]["id"] == "f3"
    bad = runner.invoke(app, [str(a) for a in [*args, "--uri", tmp_path / "faqs.txt"]])
    assert bad.exit_code == 2 and "must end in .db" in bad.stderr


@pytest.mark.parametrize(("source", "kind", "target"), [("faiss", "ivf", "milvus"), ("milvus", "hnsw", "faiss")])
def test_moving_an_index_to_another_backend_copies_its_vectors(tmp_path, source, kind, target, tiny_encoder):
    records = many_records(60)
    options = backend_options(source, tmp_path)
    index = FaqIndex.build(records, tiny_encoder, kind=kind, backend=source, backend_options=options, progress=False)
    index.editor().delete(["q3"])
    index.moved_to(target, backend_options(target, tmp_path), kind="flat", progress=False).save(tmp_path / "moved")
    moved = FaqIndex.load(tmp_path / "moved")
    assert moved.manifest.backend["name"] == target and moved.manifest.kind == "flat" and len(moved.store) == 59
    exact = FaqIndex.build([r for r in records if r.id != "q3"], tiny_encoder, progress=False)
    queries = tiny_encoder.encode([r.question for r in records[::7]])
    assert_same_rankings(moved.search_vectors(queries, 10), exact.search_vectors(queries, 10))


@pytest.mark.parametrize("kind", ["flat", "ivf", "hnsw"])
def test_faiss_shards_match_one_index(tmp_path, kind):
    data = synthetic_vectors(600, DIM, seed=1, clusters=6)
    single = FaissStore(DIM, kind, nlist=8, nprobe=8)
    sharded = FaissStore(DIM, kind, nlist=8, nprobe=8, shards=3)
    for store in single, sharded:
        store.add(np.arange(600), data)
    assert len(sharded.parts) == 3 and {int(part.ntotal) for part in sharded.parts} == {200}
    expected = single.search(data[:20], 5)[1]
    assert np.array_equal(sharded.search(data[:20], 5)[1], expected)
    assert sharded.delete(np.arange(0, 600, 7)) == len(range(0, 600, 7))
    loaded = reopen(sharded, "faiss", tmp_path / "vectors")
    assert len(loaded) == len(sharded) and np.array_equal(
        loaded.search(data[:20], 5)[1], sharded.search(data[:20], 5)[1]
    )


def test_ivf_trains_on_a_sample_of_a_large_first_batch(monkeypatch):
    import medfaq.index.faiss_store as faiss_store_module

    monkeypatch.setattr(faiss_store_module, "TRAIN_SAMPLE", 200)
    data = synthetic_vectors(1000, DIM, seed=2, clusters=5)
    store = FaissStore(DIM, "ivf", nprobe=64)
    store.add(np.arange(1000), data)
    assert store.nlist == faiss_store_module.default_nlist(200) and len(store) == 1000
    assert store.search(data[:5], 1)[1][:, 0].tolist() == [0, 1, 2, 3, 4]


class FakeGpu:
    """Stands in for faiss' GPU functions: records the copies made and returns the CPU index to search."""

    def __init__(self, monkeypatch, gpus: int) -> None:
        self.copies: list[tuple] = []
        monkeypatch.setattr(faiss, "StandardGpuResources", lambda: "resources", raising=False)
        monkeypatch.setattr(faiss, "get_num_gpus", lambda: gpus)
        monkeypatch.setattr(faiss, "index_cpu_to_gpu", self.to_gpu, raising=False)
        monkeypatch.setattr(faiss, "index_cpu_to_all_gpus", self.to_all_gpus, raising=False)
        monkeypatch.setattr(faiss, "GpuMultipleClonerOptions", lambda: type("Options", (), {})(), raising=False)

    def to_gpu(self, resources, device, index):
        self.copies.append(("gpu", device))
        return index

    def to_all_gpus(self, index, co=None):
        self.copies.append(("all", co.shard))
        return index


@pytest.mark.parametrize(
    ("gpus", "use_gpu", "kind", "shards", "expected"),
    [
        (1, None, "flat", 1, [("gpu", 0)]),  # auto: a visible GPU is used
        (1, False, "flat", 1, []),  # --cpu forces the CPU
        (0, None, "flat", 1, []),  # no GPU: CPU
        (1, None, "hnsw", 1, []),  # HNSW stays on the CPU
        (2, None, "ivf", 1, [("all", True)]),  # several GPUs: the vectors are sharded over them
        (2, True, "flat", 2, [("gpu", 0), ("gpu", 1)]),  # one shard per GPU
    ],
)
def test_gpu_choice(monkeypatch, gpus, use_gpu, kind, shards, expected, vectors):
    fake = FakeGpu(monkeypatch, gpus)
    store = FaissStore(DIM, kind, nlist=2, use_gpu=use_gpu, shards=shards)
    store.add(np.arange(40), vectors)
    for _ in range(2):  # the GPU copy is made once and reused
        assert store.search(vectors[:2], 1)[1][:, 0].tolist() == [0, 1]
    assert fake.copies == expected and store.on_gpu() == bool(expected)
    store.search(vectors[:2], 1, allowed=np.array([0, 1]))  # filtered searches run on the CPU index
    assert fake.copies == expected


def test_model_device_choice(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert choose_device() == "cuda" and choose_device("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert choose_device() == "cpu"


def test_multi_process_encoding_matches_one_process(faq_records, tiny_encoder):
    one = FaqIndex.build(faq_records, tiny_encoder, progress=False)
    two = FaqIndex.build(faq_records, tiny_encoder, progress=False, workers=2)
    vectors = tiny_encoder.encode([r.question for r in faq_records])
    assert_same_rankings(two.search_vectors(vectors, 3), one.search_vectors(vectors, 3))


def test_ann_comparison_rows():
    rows = ann_comparison(3000, 32, n_queries=20, clusters=30, nprobes=(1, 8), ef_searches=(16, 64), progress=False)
    assert {row["index"] for row in rows} == {"flat", "ivf", "hnsw", "milvus-lite"}
    assert all(row["recall_at_k"] == 1.0 for row in rows if row["index"] in {"flat", "milvus-lite"})
    assert all(sum(r["chosen"] for r in rows if r["index"] == family) == 1 for family in {r["index"] for r in rows})
    assert all(0.0 <= row["recall_at_k"] <= 1.0 and row["p50_ms"] > 0 and row["build_s"] > 0 for row in rows)


def test_index_vectors_hold_out_queries(tmp_path, tiny_encoder):
    FaqIndex.build(many_records(30), tiny_encoder, progress=False).save(tmp_path / "idx")
    base, queries = index_vectors(tmp_path / "idx", n_queries=5)
    assert base.shape == (25, tiny_encoder.dim) and queries.shape == (5, tiny_encoder.dim)
    assert not (queries[:, None, :] == base[None, :, :]).all(axis=2).any()  # held-out rows leave the base


def test_a_single_query_runs_on_one_thread_and_leaves_the_thread_count_as_it_was(vectors):
    store = FaissStore(dim=DIM, use_gpu=False)
    store.add(np.arange(40), vectors)
    assert store.thread_safe
    before = faiss.omp_get_max_threads()
    alone = [store.search(vectors[row : row + 1], 5)[1][0].tolist() for row in range(6)]
    assert faiss.omp_get_max_threads() == before
    assert store.search(vectors[:6], 5)[1].tolist() == alone


def test_a_large_flat_index_answers_a_lone_query_in_two_passes_with_the_exact_answer(monkeypatch):
    """The fp16 pass keeps every vector that can be in the exact top k: near ties closer than fp16 can tell apart,
    duplicates (in FAISS's order), k above the count, and the scan made again after a deletion."""
    import medfaq.index.faiss_store as faiss_store

    monkeypatch.setattr(faiss_store, "HALF_PRECISION_FROM", 100)
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((300, 32)).astype(np.float32)
    vectors[150:160] = vectors[0] + 1e-4 * rng.standard_normal((10, 32)).astype(np.float32)  # fp16 cannot order
    vectors[200] = vectors[1]
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    keys = np.arange(1000, 1300)
    store = FaissStore(32)
    store.add(keys, vectors)

    def exact(query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        live = np.isin(keys, store._stored_keys())
        scores = vectors[live] @ query
        order = np.lexsort((keys[live], -scores))[:k]
        return scores[order], keys[live][order]

    queries = np.concatenate([vectors[:2], rng.standard_normal((6, 32)).astype(np.float32)])
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    for step in range(2):
        for query in queries[2:]:  # random questions: the float32 search's answer, in its order
            for k in (1, 12, 400):
                assert store.search(query[None], k)[1].tolist() == store.parts[0].search(query[None], k)[1].tolist()
        for query in queries:
            for k in (1, 12, 400):
                scores, found = store.search(query[None], k)
                want_scores, want_keys = exact(query, k)
                assert store._half is not None
                # the same scores; keys differ only where float32's own rounding cannot order two vectors
                np.testing.assert_allclose(scores[0, : len(want_scores)], want_scores, atol=1e-6)
                found_scores = vectors[np.searchsorted(keys, found[0, : len(want_keys)])] @ query
                np.testing.assert_allclose(found_scores, want_scores, atol=1e-6)
                assert (found[0, len(want_keys) :] == -1).all() and np.isneginf(scores[0, len(want_scores) :]).all()
        order = store.search(vectors[1][None], 2)[1][0].tolist()
        assert order == [1200, 1001]  # equal vectors: the later-added first, as the float32 search gives them
        if step == 0:
            store.delete(keys[2:7])
            assert store._half is None  # a change drops the scan; the next search makes it again
    together = store.search(queries, 5)[1]  # a batch (a server's micro-batch): each query's answer alone
    assert together.tolist() == [store.search(query[None], 5)[1][0].tolist() for query in queries]
    scaled = FaissStore(32)  # vectors that are not unit: the bound grows with their norms
    scaled.add(keys, 3 * vectors)
    for query in 2 * queries:
        np.testing.assert_allclose(
            scaled.search(query[None], 12)[0][0], np.sort(3 * vectors @ query)[::-1][:12], atol=1e-5
        )


def test_the_two_pass_comparison_script_reports_agreement_and_refuses_a_small_index(monkeypatch, built_index, capsys):
    import medfaq.index.faiss_store as faiss_store
    from experiments import flat_search

    questions = ["Can I drink alcohol on antibiotics?", "What causes migraine?", "is shingles contagious"]
    with pytest.raises(MedfaqError, match="not a flat FAISS index searched in two passes"):
        flat_search.compare(built_index, questions, k=3)
    monkeypatch.setattr(faiss_store, "HALF_PRECISION_FROM", 1)
    report = flat_search.compare(built_index, questions, k=3)
    assert report["queries"] == 3 and report["same_best_faq"] == 3 and report["largest_score_difference"] < 1e-5
