from __future__ import annotations

import json
import zipfile

import pytest

from medfaq.common.runtime import MedfaqError, data_dir
from medfaq.index import datasets
from medfaq.index.collections import load_collection
from medfaq.index.datasets import (
    build_jhu,
    build_medquad,
    build_quebec,
    fetch_dataset,
    is_fetched,
    medquad_rows_from_xml,
)

MEDQUAD_XML = """<?xml version="1.0" encoding="UTF-8"?>
<Document id="0000001" source="ADAM" url="https://medlineplus.gov/ency/000823.htm">
<Focus>Gout</Focus>
<FocusAnnotations>
  <Category>Disease</Category>
  <UMLS><CUIs><CUI>C0018099</CUI></CUIs><SemanticTypes><SemanticType>T047</SemanticType></SemanticTypes>
  <SemanticGroup>Disorders</SemanticGroup></UMLS>
  <Synonyms><Synonym>Podagra</Synonym></Synonyms>
</FocusAnnotations>
<QAPairs>
  <QAPair pid="1"><Question qid="0000001-1" qtype="information">What is (are) Gout ?</Question>
    <Answer></Answer></QAPair>
  <QAPair pid="2"><Question qid="0000001-2" qtype="treatment">What are the treatments for Gout ?</Question>
    <Answer> Medicines such as colchicine. </Answer></QAPair>
</QAPairs>
</Document>
"""


def test_medquad_xml_becomes_the_shared_jsonl_fields():
    rows = medquad_rows_from_xml(MEDQUAD_XML, "10_MPlus_ADAM_QA")
    assert [r["id"] for r in rows] == ["10_0000001-1", "10_0000001-2"]
    first, second = rows
    assert first["focus"] == "Gout" and first["focus_category"] == "Disease"
    assert first["cuis"] == ["C0018099"] and first["semantic_group"] == "Disorders" and first["synonyms"] == ["Podagra"]
    assert first["answer"] == "" and first["answer_removed"] is True
    assert second["qtype"] == "treatment" and second["answer"] == "Medicines such as colchicine."
    assert second["url"] == "https://medlineplus.gov/ency/000823.htm" and second["pid"] == "2"


def test_medquad_archive_build_sorts_folders_and_dedups_ids(tmp_path):
    archive = tmp_path / "medquad.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("MedQuAD-x/10_MPlus_ADAM_QA/0000001.xml", MEDQUAD_XML)
        zf.writestr("MedQuAD-x/2_GARD_QA/0000001.xml", MEDQUAD_XML.replace('source="ADAM"', 'source="GARD"'))
        zf.writestr("MedQuAD-x/2_GARD_QA/0000001_copy.xml", MEDQUAD_XML)
        zf.writestr("MedQuAD-x/readme.txt", "not xml")
        zf.writestr("MedQuAD-x/docs/notes.xml", "<not-a-document/>")
    out = tmp_path / "out"
    out.mkdir()
    build_medquad([archive], out)
    records, report = load_collection(out / "medquad.jsonl")
    assert report.format == "medquad"
    assert [r.id for r in records] == [
        "2_0000001-1",
        "2_0000001-2",
        "2_0000001-1#2",
        "2_0000001-2#2",
        "10_0000001-1",
        "10_0000001-2",
    ]
    assert records[0].metadata["answer_removed"] is False


def test_quebec_and_jhu_builders_match_the_loaders(tmp_path):
    train = tmp_path / "0_train.json"
    train.write_text(
        json.dumps(
            {
                "examples": [
                    {"id": 0, "source": "s", "question": "can i go out?", "passage_id": 0},
                    {"id": 1, "source": "healthtap", "question": "my knee hurts", "passage_id": 1},
                ],
                "passages": [
                    {
                        "passage_id": 0,
                        "source": "s",
                        "uri": "u",
                        "reference_type": "faq",
                        "reference": {
                            "page_title": "P",
                            "section_headers": ["Topic", "Can I go outside?"],
                            "section_content": "Yes.",
                        },
                    },
                    {
                        "passage_id": 1,
                        "source": "s",
                        "uri": "NA",
                        "reference_type": "noisy-or-ood",
                        "reference": {"page_title": "NA", "section_headers": ["NA"], "section_content": "NA"},
                    },
                ],
            }
        )
    )
    build_quebec([train], tmp_path)
    records, report = load_collection(tmp_path / "faqs.jsonl")
    assert [(r.id, r.question, r.answer) for r in records] == [("0", "Can I go outside?", "Yes.")]
    queries = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert [q["is_ood"] for q in queries] == [False, True]

    jhu_file = tmp_path / "3_AVMA_v0.3.jsonl"
    jhu_file.write_text(
        json.dumps(
            {
                "ID": "AVMA|||1",
                "sourceName": "AVMA",
                "sourceUrl": "u",
                "language": "en",
                "typeOfInfo": "QA",
                "questionText": "Q: Can pets get it?",
                "questionOriginal": "<h5>Q</h5>",
                "answerText": "Rarely.",
                "dateLastChanged": 1.5,
            }
        )
        + "\n"
    )
    jhu_dir = tmp_path / "jhu"
    jhu_dir.mkdir()
    build_jhu([jhu_file], jhu_dir)
    (record,), report = load_collection(jhu_dir / "faqs.jsonl")
    assert report.format == "jhu" and record.id == "AVMA|||1" and record.metadata["file"] == "AVMA_v0.3.jsonl"


def test_fetch_from_local_copy_and_errors(tmp_path):
    source = tmp_path / "shared"
    (source / "medquad").mkdir(parents=True)
    (source / "medquad" / "medquad.jsonl").write_text(
        json.dumps({"id": "1_1", "question": "What is X ?", "qtype": "information", "focus": "X"}) + "\n"
    )
    target = fetch_dataset("medquad", source)
    assert target == data_dir() / "medquad" and is_fetched("medquad")
    records, _ = load_collection("medquad")  # a fetched dataset name works as a collection
    assert records[0].id == "1_1"
    with pytest.raises(MedfaqError, match="quebec_mila/faqs.jsonl not found"):
        fetch_dataset("quebec", source)
    with pytest.raises(MedfaqError, match="unknown dataset 'nope'"):
        fetch_dataset("nope", source)
    assert not list(data_dir().rglob("*.fetch-*"))  # failed fetches leave no staging folders


def test_download_failure_is_one_line(monkeypatch):
    def offline(url, timeout):
        raise OSError("network unreachable")

    monkeypatch.setattr(datasets.urllib.request, "urlopen", offline)
    with pytest.raises(MedfaqError, match="cannot download https://github.com/abachaa/MedQuAD.*--from") as error:
        fetch_dataset("medquad")
    assert "\n" not in str(error.value)


def test_fetch_from_shared_data(shared_data):
    fetch_dataset("jhu", shared_data)
    records, _ = load_collection("jhu")
    assert len(records) == 2261
