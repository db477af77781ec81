from __future__ import annotations

import pytest

from index.runtime import ModelNotFoundError, models_dir, resolve_model, seed_everything


def test_minilm_name_resolves_to_bundled_weights():
    path = resolve_model("minilm")
    assert path == resolve_model(None)
    assert path.endswith("model")


def test_local_directory_and_trained_name_resolve(tmp_path):
    assert resolve_model(tmp_path) == str(tmp_path.resolve())
    trained = models_dir() / "my-reranker"
    trained.mkdir(parents=True)
    assert resolve_model("my-reranker") == str(trained.resolve())


def test_uncached_hub_id_offline_is_one_line_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError) as error:
        resolve_model("facebook/bart-large-not-cached")
    assert "\n" not in str(error.value)
    assert "minilm" in str(error.value)


def test_file_path_is_rejected(tmp_path):
    file = tmp_path / "weights.bin"
    file.write_bytes(b"")
    with pytest.raises(ModelNotFoundError):
        resolve_model(file)


def test_seed_everything_repeats_torch_draws():
    import torch

    seed_everything(7)
    first = torch.rand(3)
    seed_everything(7)
    assert torch.equal(first, torch.rand(3))


def test_tiny_encoder_fixture_encodes(tiny_encoder_dir):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(tiny_encoder_dir), device="cpu")
    vectors = model.encode(["can I drink alcohol with amoxicillin?"], normalize_embeddings=True)
    assert vectors.shape == (1, 32)
