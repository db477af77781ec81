"""The documented examples name things that exist: the FAQ ids the HTTP API examples send are MedQuAD ids."""

from __future__ import annotations

import json
import re
from pathlib import Path

HTTP_API = Path(__file__).resolve().parents[1] / "docs" / "http-api.md"


def test_feedback_example_ids_are_medquad_ids(shared_data):
    named = set(re.findall(r'"faq_id": "([^"]+)"', HTTP_API.read_text(encoding="utf-8")))
    rows = (shared_data / "medquad" / "medquad.jsonl").read_text(encoding="utf-8").splitlines()
    ids = {json.loads(line)["id"] for line in rows if line.strip()}
    assert named and named <= ids, named - ids
