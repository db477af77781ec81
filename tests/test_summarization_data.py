from __future__ import annotations

import json

import pytest

from medfaq.common.runtime import MedfaqError
from medfaq.eval.summarization_data import load_pairs
from medfaq.index.datasets import build_rqe, fetch_dataset, get_dataset, rqe_rows_from_xml

RQE_XML = """<?xml version="1.0" encoding="UTF-8"?>
<Set>
<pair pid="1" type="originalQ-shortQ" value="true"><chq>
   How should I treat
   polymenorrhea?
</chq><faq>How to treat polymenorrhea?</faq></pair>
<pair pid="2" value="false"><chq>Glaucoma info?</chq><faq>What is asthma?</faq></pair>
</Set>
"""

SIZES = {
    "meqsum:train": 400,
    "meqsum:valid": 100,
    "meqsum:test": 500,
    "chq_summ:train": 554,
    "chq_summ:valid": 139,
    "healthcaremagic:train": 1314,
    "healthcaremagic:valid": 329,
    "mediqa2021:valid": 50,
    "mediqa2021:test": 100,
    "rqe:train": 4654,  # label-1 pairs of 8,588, less one with an empty FAQ
    "rqe:valid": 129,
    "rqe:test": 115,
}


def test_rqe_builder_collapses_whitespace_and_loader_keeps_positives(tmp_path):
    rows = rqe_rows_from_xml(RQE_XML)
    assert rows[0] == {
        "pid": "1",
        "chq": "How should I treat polymenorrhea?",
        "faq": "How to treat polymenorrhea?",
        "label": 1,
        "type": "originalQ-shortQ",
    }
    assert rows[1]["label"] == 0 and rows[1]["type"] is None
    sources = []
    for i in range(3):
        sources.append(tmp_path / f"{i}.xml")
        sources[-1].write_text(RQE_XML)
    target = tmp_path / "mediqa2019_rqe"
    target.mkdir()
    build_rqe(sources, target)
    pairs = load_pairs("rqe:test", tmp_path)
    assert [(p.id, p.chq, p.source) for p in pairs] == [("rqe:test:1", "How should I treat polymenorrhea?", "rqe:test")]


def test_spec_errors_are_one_line(tmp_path):
    with pytest.raises(MedfaqError, match="unknown summarization dataset 'icliniq'"):
        load_pairs("icliniq:test")
    with pytest.raises(MedfaqError, match="name a split"):
        load_pairs("meqsum")
    with pytest.raises(MedfaqError, match="run `medfaq data fetch meqsum`"):
        load_pairs("meqsum:test")
    (tmp_path / "meqsum").mkdir()
    (tmp_path / "meqsum" / "test.jsonl").write_text('{"id": 1, "chq": "a", "faq": "b"}\n{"id": 2,\n')
    with pytest.raises(MedfaqError, match="test.jsonl:2: malformed JSON"):
        load_pairs("meqsum:test", tmp_path)


@pytest.mark.integration
def test_shared_data_loads_and_fetches(shared_data):
    for spec, size in SIZES.items():
        pairs = load_pairs(spec, shared_data)
        assert len(pairs) == size and len({p.id for p in pairs}) == size, spec
        assert all(p.chq.strip() and p.faq.strip() for p in pairs)
    combined = load_pairs("chq_summ:valid+mediqa2021:valid", shared_data)
    assert len(combined) == 189 and combined[-1].source == "mediqa2021:valid"
    fetch_dataset("meqsum", shared_data)  # `medfaq data fetch meqsum --from ../shared/data`
    assert len(load_pairs("meqsum:valid")) == 100


@pytest.mark.integration
@pytest.mark.parametrize(
    "name, sources",
    [
        ("meqsum", ["meqsum/original/MeQSum_ACL2019_BenAbacha_Demner-Fushman.xlsx"]),
        ("chq_summ", ["chq_summ/original/medqsum_chq_sum_train.json", "chq_summ/original/medqsum_chq_sum_valid.json"]),
        (
            "mediqa2021",
            [
                "mediqa2021_qs/original/MEDIQA2021-Task1-QuestionSummarization-ValidationSet.xlsx",
                "mediqa2021_qs/original/MEDIQA2021-Task1-TestSet-ReferenceSummaries.xlsx",
            ],
        ),
    ],
)
def test_builders_reproduce_the_shared_conversions(shared_data, tmp_path, name, sources):
    """Building from the original files (as downloaded) gives the same id/chq/faq rows as ../shared/data."""
    spec = get_dataset(name)
    spec.build([shared_data / source for source in sources], tmp_path)
    for file in spec.files:
        built = [json.loads(line) for line in (tmp_path / file).read_text().splitlines()]
        shared = [json.loads(line) for line in (shared_data / spec.subdir / file).read_text().splitlines()]
        assert [(r["id"], r["chq"], r["faq"]) for r in built] == [(r["id"], r["chq"], r["faq"]) for r in shared]
