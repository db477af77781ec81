from __future__ import annotations

import json

import pytest

from medfaq.common.runtime import MedfaqError
from medfaq.index.collections import detect_format, load_collection, parse_field_map


def write_lines(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def test_generic_jsonl_loads_all_fields(faq_jsonl):
    records, report = load_collection(faq_jsonl)
    assert report.format == "jsonl" and report.loaded == 6
    assert records[0].id == "f1" and records[4].answer == ""


def test_csv_with_field_mapping_and_extra_columns_in_metadata(tmp_path):
    path = tmp_path / "faqs.csv"
    path.write_text("qid,title,body,topic\n1,What is gout?,A kind of arthritis.,joints\n2,What is flu?,,lungs\n")
    records, report = load_collection(path, field_map=parse_field_map(["id=qid", "question=title", "answer=body"]))
    assert report.format == "csv"
    assert [r.question for r in records] == ["What is gout?", "What is flu?"]
    assert records[0].metadata == {"topic": "joints"}


def test_unknown_field_names_are_one_line_errors(tmp_path, faq_jsonl):
    with pytest.raises(MedfaqError, match="unknown field name 'title'"):
        parse_field_map(["title=question"])
    with pytest.raises(MedfaqError, match="unknown field name.*'heading'"):
        load_collection(faq_jsonl, field_map=parse_field_map(["question=heading"]))
    with pytest.raises(MedfaqError, match="bad field mapping"):
        parse_field_map(["question"])


def test_malformed_jsonl_names_the_line_and_skip_bad_counts(tmp_path):
    path = write_lines(
        tmp_path / "bad.jsonl", [{"id": "a", "question": "q a"}, "{not json", {"id": "b", "question": "q b"}]
    )
    with pytest.raises(MedfaqError, match=r"bad.jsonl:2: malformed JSON") as error:
        load_collection(path)
    assert "\n" not in str(error.value)
    records, report = load_collection(path, skip_bad=True)
    assert [r.id for r in records] == ["a", "b"]
    assert report.skipped_bad == 1 and report.bad_lines == [2]


def test_missing_required_field_is_malformed(tmp_path):
    path = write_lines(tmp_path / "f.jsonl", [{"id": "a", "question": "q"}, {"question": "no id"}])
    with pytest.raises(MedfaqError, match=r"f.jsonl:2: missing required field\(s\) id"):
        load_collection(path)


def test_duplicate_ids_are_named(tmp_path):
    path = write_lines(tmp_path / "d.jsonl", [{"id": "x", "question": "a"}, {"id": "x", "question": "b"}])
    with pytest.raises(MedfaqError, match="duplicate FAQ ids .*'x'"):
        load_collection(path)


def test_empty_questions_are_skipped_and_counted(tmp_path):
    path = write_lines(tmp_path / "e.jsonl", [{"id": "a", "question": "  "}, {"id": "b", "question": "real?"}])
    records, report = load_collection(path)
    assert [r.id for r in records] == ["b"] and report.skipped_empty == 1
    assert "1 with an empty question skipped" in report.summary()


def test_non_utf8_and_missing_files(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes('{"id": "a", "question": "ok"}\n{"id": "b", "question": "caf\u00e9"}\n'.encode("latin-1"))
    with pytest.raises(MedfaqError, match=r"latin1.jsonl:2: not UTF-8"):
        load_collection(path)
    with pytest.raises(MedfaqError, match="collection not found"):
        load_collection(tmp_path / "nope.jsonl")
    with pytest.raises(MedfaqError, match="unknown format"):
        load_collection(path, format="xml")


def test_medquad_quebec_jhu_formats_are_detected(tmp_path):
    medquad = write_lines(
        tmp_path / "medquad.jsonl",
        [
            {
                "id": "1_0001-1",
                "question": "What is X ?",
                "answer": "",
                "qtype": "information",
                "focus": "X",
                "focus_category": None,
                "collection": "1_CancerGov_QA",
                "source": "CancerGov",
                "url": "u",
            }
        ],
    )
    quebec = write_lines(
        tmp_path / "quebec.jsonl",
        [
            {"passage_id": 0, "reference_type": "faq", "faq_question": "Can I travel?", "answer": "No.", "uri": "u"},
            {"passage_id": 1, "reference_type": "noisy-or-ood", "faq_question": "NA", "answer": "NA", "uri": "NA"},
        ],
    )
    jhu = write_lines(
        tmp_path / "jhu.jsonl",
        [
            {
                "id": "A|||1",
                "source_name": "AVMA",
                "source_url": "u",
                "language": "en",
                "type_of_info": "QA",
                "question": "Can pets get it?",
                "answer": "Rarely.",
                "date_last_changed": 1589487189.1,
            }
        ],
    )
    assert [detect_format(p) for p in (medquad, quebec, jhu)] == ["medquad", "quebec", "jhu"]
    (record,), _ = load_collection(medquad)
    assert record.metadata["qtype"] == "information" and record.metadata["collection"] == "1_CancerGov_QA"
    records, report = load_collection(quebec)
    assert [r.id for r in records] == ["0"] and report.skipped_other == 1
    (record,), _ = load_collection(jhu)
    assert record.source == "AVMA" and record.metadata["language"] == "en"


def test_shared_medquad_loads_completely(shared_data):
    records, report = load_collection(shared_data / "medquad" / "medquad.jsonl")
    assert report.format == "medquad" and report.loaded == 47441
    assert sum(1 for r in records if r.answer) == 16407
