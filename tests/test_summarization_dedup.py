from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from medfaq.app.cli import app
from medfaq.common.runtime import MedfaqError
from medfaq.eval.summarization_data import load_pairs
from medfaq.eval.summarization_dedup import collect_samples, find_duplicates, group_keys, normalise, resplit, sample_key


def write_split(root, subdir: str, split: str, rows: list[dict]) -> None:
    (root / subdir).mkdir(parents=True, exist_ok=True)
    (root / subdir / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def unique_question(i: int) -> str:
    return f"Question number {i} about condition {i * 7} and its treatment options for my family"


@pytest.fixture
def planted(tmp_path):
    """MeQSum-like splits with planted duplicates: exact (train/train), normalised (train/test), contained (valid)."""
    root = tmp_path / "data"
    train = [{"id": i, "chq": unique_question(i), "faq": f"What treats {i}?"} for i in range(16)]
    train.append({"id": 100, "chq": unique_question(0), "faq": "What treats 0?"})  # exact copy inside train
    valid = [{"id": 200 + i, "chq": unique_question(200 + i), "faq": "x"} for i in range(3)]
    truncated = " ".join(unique_question(1).split()[:9])  # the first 9 words of train 1
    valid.append({"id": 300, "chq": truncated, "faq": "truncated"})
    test = [{"id": 400 + i, "chq": unique_question(400 + i), "faq": "y"} for i in range(2)]
    test.append({"id": 500, "chq": '"QUESTION number 2 about\ncondition 14, and its treatment options for my family!"'})
    test[-1]["faq"] = "z"
    write_split(root, "meqsum", "train", train)
    write_split(root, "meqsum", "valid", valid)
    write_split(root, "meqsum", "test", test)
    return root


def test_normalisation_follows_ecl_cleaning():
    assert normalise('Is "flu"\nBAD?!  Yes\\no') == "is flu bad yes no"
    row = {"chq": "A  b.", "faq": "F"}
    assert sample_key(row, "exact") == "A  b." and sample_key(row, "normalised") == "a b"
    assert sample_key(row, "normalised", "pair") != sample_key({"chq": "a b", "faq": "G"}, "normalised", "pair")
    with pytest.raises(MedfaqError, match="unknown duplicate level"):
        group_keys([row], "fuzzy")


def test_finds_planted_duplicates_at_every_level(planted):
    samples = collect_samples(["meqsum"], planted)
    report = find_duplicates(samples)
    assert report.sizes == {"meqsum:train": 17, "meqsum:valid": 4, "meqsum:test": 3}
    exact, normalised, contained = (report.levels[level] for level in ("exact", "normalised", "contained"))
    assert (exact.removable, exact.within["meqsum:train"], sum(exact.across.values())) == (1, 1, 0)
    assert normalised.removable == 2 and normalised.across["meqsum:train | meqsum:test"] == 1
    assert contained.removable == 3 and contained.across["meqsum:train | meqsum:valid"] == 1
    assert exact.examples[0][0]["source"] == "meqsum:train" and {s["id"] for s in exact.examples[0]} == {"0", "100"}
    assert "removable" in report.format() and json.dumps(report.to_dict())


def test_resplit_is_8_1_1_seeded_and_duplicate_free(planted, tmp_path):
    samples = collect_samples(["meqsum"], planted)
    out = tmp_path / "resplit"
    counts = resplit(samples, out, seed=3, level="contained")
    assert counts == {"meqsum": {"train": 17, "valid": 2, "test": 2}}  # 24 samples - 3 duplicates = 21
    keys = {}
    for split in ("train", "valid", "test"):
        for pair in load_pairs(f"meqsum:{split}", out):
            keys.setdefault(normalise(pair.chq)[:50], set()).add(split)
    assert all(len(splits) == 1 for splits in keys.values()) and len(keys) == 21
    first = (out / "meqsum" / "test.jsonl").read_text()
    resplit(samples, out, seed=3, level="contained")
    assert (out / "meqsum" / "test.jsonl").read_text() == first
    resplit(samples, out, seed=4, level="contained")
    assert (out / "meqsum" / "test.jsonl").read_text() != first
    assert json.loads(first.splitlines()[0])["original_split"] in {"train", "valid", "test"}


def test_dedup_cli(planted, tmp_path):
    runner = CliRunner()
    out = tmp_path / "out"
    args = ["data", "dedup", "meqsum", "--data-root", str(planted), "--json", "--resplit", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["levels"]["normalised"]["removable"] == 2
    assert report["resplit"] == {"meqsum": {"train": 18, "valid": 2, "test": 2}}
    text = runner.invoke(app, ["data", "dedup", "meqsum:train", "--data-root", str(planted)])
    assert text.exit_code == 0 and "exact: 1 duplicate groups" in text.stdout
    for bad, message in (
        (["data", "dedup", "icliniq"], "unknown summarization dataset 'icliniq'"),
        (["data", "dedup", "meqsum", "--resplit"], "--resplit needs --out"),
        (
            ["data", "dedup", "meqsum:train", "--data-root", str(planted), "--field", "answer"],
            "unknown duplicate field",
        ),
    ):
        result = runner.invoke(app, bad)
        assert result.exit_code == 2 and result.stderr.strip().startswith("error: ") and message in result.stderr
