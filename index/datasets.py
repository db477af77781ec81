"""The registry of public datasets medfaq can fetch, and `fetch_dataset` (download or copy into `data_dir()`).

Each dataset declares itself once, in the table at the end of this module: a :class:`DatasetSpec` names its
original public sources (pinned commits), the files it puts under ``data_dir()/<subdir>`` (the same layout as a
local copy such as ``../shared/data``), its license note, a `build` function that turns the downloaded sources into
those files, and what it is used for: an FAQ bank (`collection`), summarization pairs (`summary_splits`), retrieval
benchmarks (`benchmarks`, each of one kind: a real FAQ bank or a summary-matching set), a source of query -> FAQ
training pairs (`training_source`), evaluation splits training keeps out (`held_out`), the development split
abstention thresholds are calibrated on (`calibration`). The lists other packages read (`SUMMARIZATION_DATASETS`,
`BENCHMARKS`, `FAQ_SOURCES`, `TRAINING_SPLITS`, ...) are derived from that table.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import tempfile
import urllib.request
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from xml.etree import ElementTree

from medfaq.common.runtime import MedfaqError, data_dir

logger = logging.getLogger("medfaq.datasets")

Builder = Callable[[list[Path], Path], None]
"""build(downloaded source files, in `DatasetSpec.urls` order, target directory) writes `DatasetSpec.files`."""


@dataclass(frozen=True)
class DatasetSpec:
    """A public dataset: where it comes from, what files it provides, and its terms of use."""

    name: str
    description: str
    license: str
    subdir: str
    files: tuple[str, ...]
    urls: tuple[str, ...]
    build: Builder
    collection: str | None = None  # the FAQ collection file among `files`, for `medfaq index build NAME`
    summary_splits: tuple[str, ...] = ()  # splits of CHQ -> FAQ summarization pairs (eval/summarization_data.py)
    positive_only: bool = False  # summarization pairs: only the rows labelled 1 (entailment pairs)
    benchmarks: tuple[BenchmarkSpec, ...] = ()  # retrieval benchmarks made from it (eval/benchmarks.py)
    training_source: str = ""  # query -> FAQ training: "default" (on by default), "optional" or "" (not a source)
    held_out: tuple[str, ...] = ()  # evaluation splits whose questions no training pair may contain
    calibration: bool = (
        False  # its valid split calibrates the abstention thresholds (retriever/decisions/abstention.py)
    )


REAL_BANK = "real-bank"
SUMMARY_MATCHING = "summary-matching"
BENCHMARK_KINDS = {
    REAL_BANK: "Real FAQ banks: the evidence for defaults",
    SUMMARY_MATCHING: "Summary-matching sets (the corpus is the questions' own reference summaries): not evidence "
    "for defaults",
}
"""Benchmark kind -> the heading its results are reported under, in report order. A real FAQ bank holds FAQs that
exist independently of its questions, which consumers wrote, and its judgements point into the bank; in a
summary-matching set the corpus is made of (or seeded with) the test questions' own reference summaries."""


@dataclass(frozen=True)
class BenchmarkSpec:
    """A retrieval benchmark made from a dataset, of `kind` `REAL_BANK` or `SUMMARY_MATCHING`. With a
    `query_split`: the distinct CHQs of that split of the dataset's summarization pairs searched against the distinct
    FAQs of its `corpus_splits`, gold = the FAQs each CHQ is paired with; without: built by its own function in
    eval/benchmarks.py."""

    name: str
    query_split: str = ""
    corpus_splits: tuple[str, ...] = ()
    description: str = ""
    kind: str = ""

    def __post_init__(self) -> None:
        if self.kind not in BENCHMARK_KINDS:
            raise ValueError(f"benchmark {self.name!r}: kind {self.kind!r} is not one of {', '.join(BENCHMARK_KINDS)}")


DATASETS: dict[str, DatasetSpec] = {}


def register(spec: DatasetSpec) -> DatasetSpec:
    """Add a dataset to the registry (the table at the end of this module)."""
    DATASETS[spec.name] = spec
    return spec


def get_dataset(name: str) -> DatasetSpec:
    if name not in DATASETS:
        raise MedfaqError(f"unknown dataset {name!r}; known: {', '.join(sorted(DATASETS))}")
    return DATASETS[name]


def dataset_dir(name: str) -> Path:
    return data_dir() / get_dataset(name).subdir


def is_fetched(name: str) -> bool:
    return all((dataset_dir(name) / file).is_file() for file in get_dataset(name).files)


def dataset_collection_path(name: str) -> Path:
    """The FAQ collection file of a fetched dataset."""
    spec = get_dataset(name)
    if spec.collection is None:
        raise MedfaqError(f"dataset {name!r} is not an FAQ collection")
    path = dataset_dir(name) / spec.collection
    if not path.is_file():
        raise MedfaqError(f"dataset {name!r} is not fetched yet: run `medfaq data fetch {name}`")
    return path


def fetch_dataset(name: str, source_dir: Path | None = None, force: bool = False) -> Path:
    """Put dataset `name` under ``data_dir()``: copy it from `source_dir` (same layout) or download and build it.

    The files are written into a temporary directory beside the target and moved into place only when complete,
    so an interrupted fetch leaves no half-written dataset.
    """
    spec = get_dataset(name)
    target = dataset_dir(name)
    if is_fetched(name) and not force:
        logger.info("%s already present in %s", name, target)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}.fetch-") as tmp:
        staging = Path(tmp) / "data"
        staging.mkdir()
        if source_dir is not None:
            _copy_from(spec, Path(source_dir).expanduser(), staging)
        else:
            downloads = Path(tmp) / "downloads"
            downloads.mkdir()
            paths = [_download(url, downloads / f"{i}_{PurePosixPath(url).name}") for i, url in enumerate(spec.urls)]
            spec.build(paths, staging)
        missing = [file for file in spec.files if not (staging / file).is_file()]
        if missing:
            raise MedfaqError(f"fetching {name} did not produce {', '.join(missing)}")
        for file in spec.files:
            destination = target / file
            destination.parent.mkdir(parents=True, exist_ok=True)
            (staging / file).replace(destination)
    return target


def _copy_from(spec: DatasetSpec, source_dir: Path, staging: Path) -> None:
    if not source_dir.is_dir():
        raise MedfaqError(f"--from {source_dir}: no such directory")
    for file in spec.files:
        source = source_dir / spec.subdir / file
        if not source.is_file():
            raise MedfaqError(f"--from {source_dir}: {spec.subdir}/{file} not found (expected the shared/data layout)")
        destination = staging / file
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, destination)


def _download(url: str, destination: Path) -> Path:
    """Download `url` to `destination` with a progress bar; network failures become one-line errors."""
    from tqdm.auto import tqdm

    logger.info("downloading %s", url)
    try:
        with urllib.request.urlopen(url, timeout=60) as response, destination.open("wb") as out:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=destination.name, leave=False) as bar:
                while chunk := response.read(1 << 20):
                    out.write(chunk)
                    bar.update(len(chunk))
    except OSError as error:
        raise MedfaqError(f"cannot download {url}: {error}; use --from DIR to copy a local copy instead") from None
    return destination


def copy_as(*names: str) -> Builder:
    """A builder that stores the downloaded files under `names`, unchanged."""

    def build(paths: list[Path], target: Path) -> None:
        for path, name in zip(paths, names, strict=True):
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target / name)

    return build


def _write_jsonl(rows: list[dict], path: Path) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")


# --- MedQuAD: XML files in 12 folders -> medquad.jsonl -------------------------------------------------------------

MEDQUAD_COMMIT = "577bd37b96c02d1833b2c9eed2de9f96964e96cb"
MEDQUAD_ANSWERS_REMOVED = {"10_MPlus_ADAM_QA", "11_MPlusDrugs_QA", "12_MPlusHerbsSupplements_QA"}


def medquad_rows_from_xml(xml_text: str | bytes, folder: str) -> list[dict]:
    """Convert one MedQuAD XML document (from `folder`, e.g. ``"1_CancerGov_QA"``) into medquad.jsonl rows."""
    root = ElementTree.fromstring(xml_text)
    annotations = root.find("FocusAnnotations")

    def texts(path: str) -> list[str]:
        return [(node.text or "").strip() for node in annotations.iterfind(path)] if annotations is not None else []

    category = texts("Category")
    group = texts("UMLS/SemanticGroup")
    document = {
        "doc_id": root.get("id", ""),
        "collection": folder,
        "source": root.get("source", ""),
        "url": root.get("url", ""),
        "focus": (root.findtext("Focus") or "").strip(),
        "focus_category": category[0] if category else None,
        "cuis": texts("UMLS/CUIs/CUI"),
        "semantic_types": texts("UMLS/SemanticTypes/SemanticType"),
        "semantic_group": group[0] if group else None,
        "synonyms": texts("Synonyms/Synonym"),
    }
    folder_number = folder.split("_", 1)[0]
    rows = []
    for pair in root.iterfind("QAPairs/QAPair"):
        question = pair.find("Question")
        qid = question.get("qid", "") if question is not None else ""
        rows.append(
            {
                "id": f"{folder_number}_{qid}",
                "qid_original": qid,
                "doc_id": document["doc_id"],
                "pid": pair.get("pid", ""),
                **{key: value for key, value in document.items() if key != "doc_id"},
                "qtype": question.get("qtype", "") if question is not None else "",
                "question": (question.text or "").strip() if question is not None else "",
                "answer": (pair.findtext("Answer") or "").strip(),
                "answer_removed": folder in MEDQUAD_ANSWERS_REMOVED,
            }
        )
    return rows


def make_ids_unique(rows: list[dict]) -> None:
    """Give repeated ids a ``#k`` suffix (k = 2, 3, ...) in order of appearance, in place."""
    seen: dict[str, int] = {}
    for row in rows:
        count = seen.get(row["id"], 0) + 1
        seen[row["id"]] = count
        if count > 1:
            row["id"] = f"{row['id']}#{count}"


def _folder_number(member: str) -> int | None:
    """12 for ``MedQuAD-<commit>/12_MPlusHerbsSupplements_QA/x.xml``; None outside the numbered folders."""
    prefix = PurePosixPath(member).parent.name.split("_", 1)[0]
    return int(prefix) if prefix.isdigit() else None


def build_medquad(paths: list[Path], target: Path) -> None:
    """Convert the MedQuAD repository archive (zip of 12 folders of XML files) into ``medquad.jsonl``."""
    from tqdm.auto import tqdm

    rows: list[dict] = []
    with zipfile.ZipFile(paths[0]) as archive:
        members = sorted(
            (name for name in archive.namelist() if name.endswith(".xml") and _folder_number(name) is not None),
            key=lambda name: (_folder_number(name), PurePosixPath(name).name),
        )
        for name in tqdm(members, desc="MedQuAD XML", unit="file"):
            folder = PurePosixPath(name).parent.name
            try:
                rows.extend(medquad_rows_from_xml(archive.read(name), folder))
            except ElementTree.ParseError as error:
                raise MedfaqError(f"MedQuAD archive: cannot parse {name}: {error}") from None
    make_ids_unique(rows)
    _write_jsonl(rows, target / "medquad.jsonl")


# --- Quebec COVID-19 FAQ (Mila): train.json {examples, passages} -> faqs.jsonl + train.jsonl ---------------------

QUEBEC_COMMIT = "4e6700317722f8b594bb0cb2e0ce0b4de3bbf71e"
QUEBEC_FOLDER = "20200416_quebec_faq_en_cleaned_collection1_2_3_plus_healthtap_newformat"


def build_quebec(paths: list[Path], target: Path) -> None:
    """Split the original ``train.json`` into the FAQ passages and the paraphrase queries."""
    try:
        original = json.loads(paths[0].read_text(encoding="utf-8"))
        passages, examples = original["passages"], original["examples"]
    except (json.JSONDecodeError, KeyError, UnicodeDecodeError) as error:
        raise MedfaqError(f"Quebec FAQ train.json has an unexpected format: {error}") from None
    faqs = []
    for passage in passages:
        reference = passage.get("reference") or {}
        headers = reference.get("section_headers") or []
        faqs.append(
            {
                "passage_id": passage["passage_id"],
                "reference_type": passage.get("reference_type"),
                "source": passage.get("source"),
                "uri": passage.get("uri"),
                "page_title": reference.get("page_title"),
                "section_headers": headers,
                "faq_question": headers[-1] if headers else "",
                "answer": reference.get("section_content") or "",
            }
        )
    is_faq = {faq["passage_id"]: faq["reference_type"] == "faq" for faq in faqs}
    queries = [
        {
            "id": example["id"],
            "source": example.get("source"),
            "question": example["question"],
            "passage_id": example["passage_id"],
            "is_ood": not is_faq.get(example["passage_id"], False),
        }
        for example in examples
    ]
    _write_jsonl(faqs, target / "faqs.jsonl")
    _write_jsonl(queries, target / "train.jsonl")


# --- JHU COVID-QA FAQ bank, schema v0.3: 20 camelCase JSONL files -> faqs.jsonl ------------------------------------

JHU_COMMIT = "9869dd7a0fd795620c2ebb538074d833e157b2de"
JHU_FILES = (
    "AVMA",
    "CNN",
    "CanadaPublicHealth",
    "ClevelandClinic",
    "DeepsetAI",
    "Delaware",
    "FDA",
    "Florida",
    "Hawaii",
    "JHU-bloomberg",
    "JHU_Medicine",
    "JHU_hub",
    "Kansas",
    "NFID",
    "NYT",
    "North_Dakota",
    "Oregon",
    "TexasHR",
    "Vermont",
    "WhoMyth",
)
JHU_FIELDS = {
    "ID": "id",
    "sourceName": "source_name",
    "sourceUrl": "source_url",
    "language": "language",
    "typeOfInfo": "type_of_info",
    "topic": "topic",
    "targetLocation": "target_location",
    "hasAnswer": "has_answer",
    "questionText": "question",
    "answerText": "answer",
    "dateLastChanged": "date_last_changed",
}


def jhu_row(original: dict, file: str) -> dict:
    """One schema-v0.3 row in snake_case, without the HTML ``*Original`` fields."""
    return {new: original.get(old) for old, new in JHU_FIELDS.items()} | {"file": file}


def build_jhu(paths: list[Path], target: Path) -> None:
    rows = []
    for path in paths:
        file = path.name.split("_", 1)[1]  # downloads are named "<i>_<original name>"
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                rows.append(jhu_row(json.loads(line), file))
    _write_jsonl(rows, target / "faqs.jsonl")


# --- Curai medical question pairs (duplicate-question detection) ---------------------------------------------------


# --- COVID-Q: real COVID-19 questions in classes of the same question ------------------------------------------------


# --- Question summarization sets (CHQ -> FAQ pairs): {"id", "chq", "faq", ...} JSONL per split ----------------------


def xlsx_rows(path: Path) -> list[dict]:
    """The rows of the first sheet of an .xlsx file as dicts keyed by the header row (empty columns dropped)."""
    from openpyxl import load_workbook

    workbook = load_workbook(path, read_only=True, data_only=True)
    try:
        rows = workbook.worksheets[0].iter_rows(values_only=True)
        header = [str(cell).strip() if cell is not None else None for cell in next(rows)]
        return [
            {name: cell for name, cell in zip(header, row) if name}
            for row in rows
            if any(cell is not None for cell in row)
        ]
    finally:
        workbook.close()


def _cell(value: object) -> str:
    return "" if value is None else str(value)


MEQSUM_COMMIT = "51e36cf65c12602333b6fdc3ae8ecf10430529f7"
MEQSUM_SPLIT_SEED = 42
MEQSUM_SPLIT = (("train", 400), ("valid", 100), ("test", 500))


def build_meqsum(paths: list[Path], target: Path) -> None:
    """MeQSum xlsx (sheet QS: File, CHQ, Summary) -> meqsum_all.jsonl + a seeded 400/100/500 split.

    No official split exists; rows are shuffled with ``random.Random(42)`` and written in row order per split.
    """
    rows = [
        {"id": i, "file": _cell(row.get("File")), "chq": _cell(row.get("CHQ")), "faq": _cell(row.get("Summary"))}
        for i, row in enumerate(xlsx_rows(paths[0]))
    ]
    order = list(range(len(rows)))
    random.Random(MEQSUM_SPLIT_SEED).shuffle(order)
    start = 0
    for split, size in MEQSUM_SPLIT:
        for i in order[start : start + size]:
            rows[i]["split"] = split
        start += size
    _write_jsonl(rows, target / "meqsum_all.jsonl")
    for split, _ in MEQSUM_SPLIT:
        _write_jsonl([row for row in rows if row.get("split") == split], target / f"{split}.jsonl")


MEDQSUM_COMMIT = "8cbd7d14c295145de7b1db89b7a8b2f851c1b1e1"


def medqsum_subset(folder: str) -> dict[str, object]:
    """What the two MedQSum summarization subsets share: their files, sources, build, splits and uses."""
    base = f"https://raw.githubusercontent.com/zekaouinoureddine/MedQSum/{MEDQSUM_COMMIT}/data/{folder}"
    return {
        "files": ("train.jsonl", "valid.jsonl"),
        "urls": tuple(f"{base}/{split}.json" for split in ("train", "valid")),
        "build": build_medqsum_split,
        "summary_splits": ("train", "valid"),
        "training_source": "default",
        "calibration": True,
    }


def build_medqsum_split(paths: list[Path], target: Path) -> None:
    """MedQSum's pandas column-oriented JSON ``{"CHQ": {i: text}, "Summary": {i: text}}`` (train, valid) -> JSONL."""
    for path, split in zip(paths, ("train", "valid"), strict=True):
        try:
            columns = json.loads(path.read_text(encoding="utf-8"))
            rows = [
                {"id": f"{split}-{index}", "chq": chq, "faq": columns["Summary"][index], "split": split}
                for index, chq in columns["CHQ"].items()
            ]
        except (json.JSONDecodeError, KeyError, AttributeError, UnicodeDecodeError) as error:
            raise MedfaqError(f"{path.name}: unexpected MedQSum format: {error}") from None
        _write_jsonl(rows, target / f"{split}.jsonl")


MEDIQA2021_COMMIT = "8d7fe20706dd6af0d089a0252a201c3da78ded8f"


def build_mediqa2021(paths: list[Path], target: Path) -> None:
    """MEDIQA 2021 Task 1 xlsx (q_id, NLM Question, Summary[, Question Focus, Question Type]) -> valid/test JSONL."""
    extra = {"question_focus": "Question Focus", "question_type": "Question Type"}
    for path, split in zip(paths, ("valid", "test"), strict=True):
        rows = []
        for row in xlsx_rows(path):
            record = {
                "id": _cell(row.get("q_id")),
                "chq": _cell(row.get("NLM Question")),
                "faq": _cell(row.get("Summary")),
            }
            record |= {key: _cell(row[column]).strip() for key, column in extra.items() if column in row}
            rows.append(record)
        _write_jsonl(rows, target / f"{split}.jsonl")


MEDIQA2019_COMMIT = "ae5d3826d6c841923b9db831159fef0f1b893593"
RQE_FILES = (
    ("train", "MEDIQA2019-Task2-RQE-TrainingSet-AMIA2016.xml"),
    ("valid", "MEDIQA2019-Task2-RQE-ValidationSet-AMIA2016.xml"),
    ("test", "MEDIQA2019-Task2-RQE-TestSet-wLabels.xml"),
)


def rqe_rows_from_xml(xml_text: str | bytes) -> list[dict]:
    """RQE ``<pair pid value type><chq/><faq/></pair>`` elements -> rows (whitespace collapsed, 1 = entailment)."""
    root = ElementTree.fromstring(xml_text)
    return [
        {
            "pid": pair.get("pid", ""),
            "chq": " ".join((pair.findtext("chq") or "").split()),
            "faq": " ".join((pair.findtext("faq") or "").split()),
            "label": int(pair.get("value", "").strip().lower() == "true"),
            "type": pair.get("type"),
        }
        for pair in root.iter("pair")
    ]


def build_rqe(paths: list[Path], target: Path) -> None:
    for path, (split, _) in zip(paths, RQE_FILES, strict=True):
        try:
            rows = rqe_rows_from_xml(path.read_bytes())
        except ElementTree.ParseError as error:
            raise MedfaqError(f"{path.name}: cannot parse RQE XML: {error}") from None
        _write_jsonl(rows, target / f"{split}.jsonl")


# --- The registry: each dataset once, in this order (the order of the default training sources) ----------------------

register(
    DatasetSpec(
        name="meqsum",
        description="MeQSum: 1,000 consumer health questions with expert summaries (seeded 400/100/500 split)",
        license="CC BY 4.0 (abachaa/MeQSum README); cite Ben Abacha & Demner-Fushman, ACL 2019",
        subdir="meqsum",
        files=("meqsum_all.jsonl", "train.jsonl", "valid.jsonl", "test.jsonl"),
        urls=(
            f"https://raw.githubusercontent.com/abachaa/MeQSum/{MEQSUM_COMMIT}/"
            "MeQSum_ACL2019_BenAbacha_Demner-Fushman.xlsx",
        ),
        build=build_meqsum,
        summary_splits=("train", "valid", "test"),
        benchmarks=(
            BenchmarkSpec(
                "meqsum",
                "test",
                ("train", "valid", "test"),
                "MeQSum test CHQs -> all MeQSum FAQs; gold = the CHQ's own FAQ",
                SUMMARY_MATCHING,
            ),
        ),
        training_source="default",
        held_out=("valid", "test"),
        calibration=True,
    )
)

register(
    DatasetSpec(
        name="mediqa2021",
        description="MEDIQA 2021 question summarization: 50 validation and 100 test NLM questions with summaries",
        license="CC BY 4.0 (abachaa/MEDIQA2021 Task1 README)",
        subdir="mediqa2021_qs",
        files=("valid.jsonl", "test.jsonl"),
        urls=tuple(
            f"https://raw.githubusercontent.com/abachaa/MEDIQA2021/{MEDIQA2021_COMMIT}/Task1/{name}.xlsx"
            for name in (
                "MEDIQA2021-Task1-QuestionSummarization-ValidationSet",
                "MEDIQA2021-Task1-TestSet-ReferenceSummaries",
            )
        ),
        build=build_mediqa2021,
        summary_splits=("valid", "test"),
        benchmarks=(
            BenchmarkSpec(
                "mediqa2021",
                "test",
                ("valid", "test"),
                "MEDIQA 2021 test CHQs -> all MEDIQA 2021 FAQs (valid+test); gold = the CHQ's own FAQ",
                SUMMARY_MATCHING,
            ),
        ),
        held_out=("valid", "test"),
    )
)

register(
    DatasetSpec(
        name="healthcaremagic",
        description="HealthCareMagic question summarization subset (1,643 questions with their titles; "
        "1,314/329 split)",
        license="copyright healthcaremagic.com (MedDialog README); research use only",
        subdir="healthcaremagic",
        **medqsum_subset("hcm_sum"),
    )
)

register(
    DatasetSpec(
        name="chq_summ",
        description="CHQ-Summ subset (693 Yahoo! Answers health questions with summaries; random 554/139 split)",
        license="question text from Yahoo! Answers L6 (Yahoo Webscope terms): research only, do not redistribute",
        subdir="chq_summ",
        **medqsum_subset("chq_sum"),
    )
)

register(
    DatasetSpec(
        name="rqe",
        description="MEDIQA 2019 RQE: CHQ/FAQ entailment pairs (8,588 train, 302 valid, 230 test; label 1 = entailed)",
        license="train/valid CC BY 4.0 (RQE_Data_AMIA2016 Readme); test: no license statement (abachaa/MEDIQA2019)",
        subdir="mediqa2019_rqe",
        files=tuple(f"{split}.jsonl" for split, _ in RQE_FILES),
        urls=tuple(
            f"https://raw.githubusercontent.com/abachaa/MEDIQA2019/{MEDIQA2019_COMMIT}/MEDIQA_Task2_RQE/{name}"
            for _, name in RQE_FILES
        ),
        build=build_rqe,
        summary_splits=tuple(split for split, _ in RQE_FILES),
        positive_only=True,
        benchmarks=tuple(
            BenchmarkSpec(
                f"rqe-{split}",
                split,
                ("valid", "test"),
                f"RQE {split} CHQs -> all entailed FAQs of RQE valid+test; gold = the FAQs the CHQ entails",
                SUMMARY_MATCHING,
            )
            for split in ("valid", "test")
        ),
        training_source="default",
        held_out=("valid", "test"),
    )
)

register(
    DatasetSpec(
        name="mqp",
        description="Curai Medical Question Pairs: 3,048 doctor-written similar/different question pairs",
        license="no license stated in curai/medical-question-pair-dataset; research use",
        subdir="mqp",
        files=("mqp.csv",),
        urls=(
            "https://raw.githubusercontent.com/curai/medical-question-pair-dataset/"
            "6c7f7fd7a53cedc6fec105c0c6cb78f2e9a82cd1/mqp.csv",
        ),
        build=copy_as("mqp.csv"),
        training_source="default",
    )
)

register(
    DatasetSpec(
        name="quebec",
        description="Quebec COVID-19 FAQ (313 FAQs) with crowdsourced paraphrase queries and HealthTap OOD queries",
        license="CC BY 4.0 (ycemsubakan/covid_chatbot_data LICENSE.md)",
        subdir="covid_faq/quebec_mila",
        files=("faqs.jsonl", "train.jsonl"),
        urls=(
            f"https://raw.githubusercontent.com/ycemsubakan/covid_chatbot_data/{QUEBEC_COMMIT}/{QUEBEC_FOLDER}/train.json",
        ),
        build=build_quebec,
        collection="faqs.jsonl",
        benchmarks=(BenchmarkSpec("quebec", kind=REAL_BANK),),
        training_source="default",
    )
)

register(
    DatasetSpec(
        name="medquad",
        description="MedQuAD: 47,441 medical QA pairs from 12 NIH websites (answers of 3 MedlinePlus subsets removed)",
        license="CC BY 4.0 (abachaa/MedQuAD LICENSE.txt); cite Ben Abacha & Demner-Fushman 2019",
        subdir="medquad",
        files=("medquad.jsonl",),
        urls=(f"https://github.com/abachaa/MedQuAD/archive/{MEDQUAD_COMMIT}.zip",),
        build=build_medquad,
        collection="medquad.jsonl",
        benchmarks=(
            BenchmarkSpec("medquad-chq", kind=SUMMARY_MATCHING),
            BenchmarkSpec(
                "medquad-rqe",
                description="RQE valid+test CHQs whose entailed FAQ is a MedQuAD question -> all of MedQuAD; gold = "
                "every MedQuAD record with that question",
                kind=REAL_BANK,
            ),
        ),
        training_source="optional",
    )
)

register(
    DatasetSpec(
        name="jhu",
        description="JHU COVID-QA scraped FAQ bank, schema v0.3 (2,261 FAQs, 1,479 in English)",
        license="Apache-2.0 (JHU-COVID-QA/scraping-qas LICENSE); content scraped from the listed sites",
        subdir="covid_faq/jhu_covidqa_faq_bank_v0.3",
        files=("faqs.jsonl",),
        urls=tuple(
            f"https://raw.githubusercontent.com/JHU-COVID-QA/scraping-qas/{JHU_COMMIT}/data/scraping/schema_v0.3/{name}_v0.3.jsonl"
            for name in JHU_FILES
        ),
        build=build_jhu,
        collection="faqs.jsonl",
    )
)

register(
    DatasetSpec(
        name="covid_q",
        description="COVID-Q: 1,611 COVID-19 questions from search engines, forums and FAQ pages in 575 classes of "
        "the same question (the experts' queue experiment, experiments/feedback_gain.py, and the covid-q benchmark)",
        license="no license stated in JerryWeiAI/COVID-Q; research use",
        subdir="covid_faq/covid_q",
        files=("final_master_dataset.csv",),
        urls=(
            "https://raw.githubusercontent.com/JerryWeiAI/COVID-Q/"
            "73dfa475e8a03c5c74223c2c37d85b87fae7dca7/data/final_master_dataset.csv",
        ),
        build=copy_as("final_master_dataset.csv"),
        benchmarks=(BenchmarkSpec("covid-q", kind=REAL_BANK),),
    )
)

SUMMARIZATION_DATASETS = {name: spec.summary_splits for name, spec in DATASETS.items() if spec.summary_splits}
"""Dataset -> its splits of CHQ -> FAQ summarization pairs."""
BENCHMARKS = {bench.name: (name, bench) for name, spec in DATASETS.items() for bench in spec.benchmarks}
"""Benchmark name -> (the dataset it is made from, its spec)."""
FAQ_SOURCES = tuple(name for name, spec in DATASETS.items() if spec.training_source == "default")
"""Training sources of the query -> FAQ task, all on by default."""
OPTIONAL_FAQ_SOURCES = tuple(name for name, spec in DATASETS.items() if spec.training_source == "optional")
"""Training sources of the query -> FAQ task used only when named."""
HELD_OUT_SPLITS = tuple((name, split) for name, spec in DATASETS.items() for split in spec.held_out)
"""(dataset, split) of every evaluation split no training pair may contain."""
FAQ_TRAINING_DATA = tuple(dict.fromkeys([*FAQ_SOURCES, *(name for name, _ in HELD_OUT_SPLITS)]))
"""The datasets query -> FAQ training reads: its default sources and the evaluation splits it keeps out."""
CALIBRATION_SOURCES = tuple(name for name, spec in DATASETS.items() if spec.calibration)
"""The datasets whose development split calibrates the abstention thresholds."""
TRAINING_SPLITS = (
    *((name, "train") for name in (*FAQ_SOURCES, *OPTIONAL_FAQ_SOURCES)),
    *((name, "valid") for name in CALIBRATION_SOURCES),
)
"""(dataset, split) of every split whose questions a model medfaq trains learns from or is tuned on: the training
split of each query -> FAQ source (`train`: a summarization set's train split, RQE train, all of MQP, the training part
of the Quebec queries, all of MedQuAD; the summarizer and the question writer train on the same CHQs, the distilled
student on these texts and MedQuAD's questions) and the development split the abstention thresholds are calibrated on.
The contamination audit (eval/contamination.py) checks every benchmark's questions against them."""
