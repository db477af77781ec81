from __future__ import annotations

import inspect
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from medfaq.app.cli import app
from medfaq.app.options import NO_STAGE_FLAGS, STAGE_FLAGS, StageFlags, takes_stage_flags
from medfaq.retriever.pipeline import PipelineConfig, pipeline_settings
from medfaq.retriever.pipeline_file import read_config, store_threshold
from medfaq.retriever.queue.unanswered import default_unanswered_path

runner = CliRunner()


def medfaq(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def assert_one_line_error(result, pattern: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert pattern in lines[0]


@pytest.fixture
def built(tmp_path, faq_jsonl, tiny_encoder_dir):
    out = tmp_path / "idx"
    result = medfaq("index", "build", faq_jsonl, "--out", out, "--encoder", tiny_encoder_dir)
    assert result.exit_code == 0, result.output
    return out


def test_build_info_search_add_delete(tmp_path, built):
    info = json.loads(medfaq("index", "info", built, "--json").stdout)
    assert info["counts"]["records"] == 6 and info["kind"] == "flat" and info["fields"] == "question"

    table = medfaq("search", "--index", built, "--mode", "bm25", "--top-k", "2", "how is shingles treated")
    assert table.exit_code == 0 and "f3" in table.stdout and "rank" in table.stdout

    as_json = json.loads(medfaq("search", "--index", built, "--json", "--top-k", "3", "shingles").stdout)
    assert {"id", "score", "rank", "question"} <= set(as_json["hits"][0])
    assert len(as_json["hits"]) <= 3

    extra = tmp_path / "extra.jsonl"
    extra.write_text(json.dumps({"id": "n1", "question": "Can children take aspirin?"}) + "\n")
    assert medfaq("index", "add", built, extra).exit_code == 0
    assert "now holds 4" in medfaq("index", "delete", built, "n1", "f1", "f2").stdout
    assert json.loads(medfaq("index", "info", built, "--json").stdout)["counts"]["records"] == 4


def test_batch_search_jsonl_and_trec(tmp_path, built):
    queries = tmp_path / "q.jsonl"
    queries.write_text(
        json.dumps({"id": "q1", "question": "shingles treatment"})
        + "\n"
        + json.dumps({"id": "q2", "question": "migraine causes"})
        + "\n"
    )
    run = tmp_path / "run.jsonl"
    result = medfaq("search", "--index", built, "--mode", "bm25", "--queries", queries, "--output", run)
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in run.read_text().splitlines()]
    assert [line["id"] for line in lines] == ["q1", "q2"] and lines[0]["query"] == "shingles treatment"
    assert {"id", "score", "rank", "question"} <= set(lines[0]["results"][0])  # extended with stage_scores
    trec = tmp_path / "run.trec"
    medfaq("search", "--index", built, "--mode", "bm25", "--queries", queries, "--output", trec, "--format", "trec")
    first = trec.read_text().splitlines()[0].split()
    assert first[:4] == ["q1", "Q0", "f3", "1"] and first[5] == "medfaq"


def test_bad_inputs_give_one_line_errors(tmp_path, built, faq_jsonl):
    assert_one_line_error(medfaq("search", "--index", tmp_path / "missing", "flu"), "index directory not found")
    assert_one_line_error(medfaq("search", "--index", built, "   "), "empty query")
    (built / "records.jsonl").write_text("tampered\n")
    tampered = medfaq("search", "--index", built, "--mode", "bm25", "flu")
    assert_one_line_error(tampered, "checksum mismatch for records.jsonl")

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "question": "ok"}\n{"id": "b", \n')
    assert_one_line_error(medfaq("index", "build", bad, "--out", tmp_path / "x"), "bad.jsonl:2: malformed JSON")
    dup = tmp_path / "dup.jsonl"
    dup.write_text('{"id": "a", "question": "x"}\n{"id": "a", "question": "y"}\n')
    assert_one_line_error(medfaq("index", "build", dup, "--out", tmp_path / "x"), "duplicate FAQ ids")
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes('{"id": "a", "question": "caf\u00e9"}\n'.encode("latin-1"))
    assert_one_line_error(medfaq("index", "build", latin, "--out", tmp_path / "x"), "not UTF-8")
    assert_one_line_error(
        medfaq("index", "build", faq_jsonl, "--out", tmp_path / "x", "--field", "question=title"), "unknown field name"
    )
    assert_one_line_error(
        medfaq("index", "build", faq_jsonl, "--out", tmp_path / "x", "--kind", "lsh"), "unknown --kind 'lsh'"
    )
    assert_one_line_error(
        medfaq("index", "build", faq_jsonl, "--out", tmp_path / "x", "--encoder", "org/not-cached-model"), "offline"
    )
    assert not (tmp_path / "x").exists()


def test_batch_query_file_errors_and_skip_bad(tmp_path, faq_jsonl, tiny_encoder_dir):
    out = tmp_path / "idx"
    medfaq("index", "build", faq_jsonl, "--out", out, "--encoder", tiny_encoder_dir, "--kind", "hnsw")
    queries = tmp_path / "q.jsonl"
    queries.write_text('{"id": "q1", "question": "flu"}\n{"id": "q2", "question": "  "}\nnot json\n')
    args = ("search", "--index", out, "--queries", queries, "--output", tmp_path / "run.jsonl")
    assert_one_line_error(medfaq(*args), "q.jsonl:2: empty question")
    result = medfaq(*args, "--skip-bad")
    assert result.exit_code == 0 and "warning: 2 bad lines" in result.stderr
    assert len((tmp_path / "run.jsonl").read_text().splitlines()) == 1


def test_data_list_and_fetch_from(tmp_path):
    source = tmp_path / "shared" / "covid_faq" / "jhu_covidqa_faq_bank_v0.3"
    source.mkdir(parents=True)
    (source / "faqs.jsonl").write_text(
        json.dumps({"id": "1", "question": "q?", "source_name": "s", "type_of_info": "QA"})
    )
    result = medfaq("data", "fetch", "jhu", "--from", tmp_path / "shared")
    assert result.exit_code == 0, result.output
    assert "fetched" in medfaq("data", "list").stdout
    assert_one_line_error(medfaq("data", "fetch", "quebec", "--from", tmp_path / "shared"), "not found")


def test_demo_fetches_builds_once_and_answers(monkeypatch, tmp_path, tiny_encoder_dir):
    from medfaq.app import cmd_demo

    shared = tmp_path / "shared"
    (shared / "medquad").mkdir(parents=True)
    rows = [
        {"id": "1", "question": "Can I drink alcohol while taking amoxicillin?", "qtype": "interaction", "focus": "a"},
        {"id": "2", "question": "Is Parkinson's disease inherited?", "qtype": "inheritance", "focus": "p"},
    ]
    (shared / "medquad" / "medquad.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr(cmd_demo, "SHARED_DATA", shared)
    monkeypatch.setattr(cmd_demo, "stock_encoder", lambda first_run=False: str(tiny_encoder_dir))
    first = medfaq("demo", "--cli", "--top-k", "1")
    assert first.exit_code == 0, first.output
    assert "building the MedQuAD index" in first.stderr
    assert first.stdout.count("query: ") == len(cmd_demo.EXAMPLE_QUESTIONS)
    index_dir = cmd_demo.DemoSettings.from_env().index_dir
    store_threshold(index_dir, read_config(index_dir), 1e9)  # every example is abstained on
    again = medfaq("demo", "--cli", "--top-k", "1")
    assert "building" not in again.stderr  # the index is reused
    assert again.stdout.count("no FAQ matches well enough\n") == len(cmd_demo.EXAMPLE_QUESTIONS)
    assert not default_unanswered_path().exists()  # canned examples are not consumers' questions


def test_a_bad_top_k_names_only_that_option_before_anything_loads(monkeypatch):
    from medfaq.index import datasets

    monkeypatch.setattr(datasets, "fetch_dataset", lambda *_: pytest.fail("fetched before the check"))
    for command in (["search", "what is acne"], ["demo", "--cli"]):
        result = medfaq(*command, "--top-k", "0")
        assert_one_line_error(result, "'--top-k'")
        assert not any(name in result.stderr for name in ("candidates", "rerank_depth", "likelihood_depth"))


def _commands(command, path=("medfaq",)):
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


def test_help_texts_survive_rich_markup():
    """`--help` renders help texts as Rich markup, which silently drops unescaped square brackets."""
    import inspect

    import typer.main
    from rich.text import Text

    lost = []
    for path, command in _commands(typer.main.get_command(app)):
        for text in [command.help] + [getattr(param, "help", None) for param in command.params]:
            text = inspect.cleandoc(text or "")
            if Text.from_markup(text).plain != text.replace("\\[", "["):
                lost.append(f"{' '.join(path)}: {text}")
    assert not lost, lost
    assert "trained: MPNet, else MiniLM" in " ".join(medfaq("index", "build", "--help").stdout.split())


def test_search_without_index_uses_the_set_up_index(tmp_path, faq_jsonl, tiny_encoder_dir):
    assert_one_line_error(medfaq("search", "flu"), "run `medfaq setup`")
    assert_one_line_error(medfaq("bench", "--queries", "1"), "or pass --index DIR")
    indexes = Path(os.environ["MEDFAQ_HOME"]) / "indexes"
    stock = medfaq("index", "build", faq_jsonl, "--out", indexes / "medquad-minilm", "--encoder", tiny_encoder_dir)
    assert stock.exit_code == 0, stock.output
    first = json.loads(medfaq("search", "--json", "--mode", "bm25", "shingles").stdout)
    assert first["hits"][0]["id"] == "f3"

    extra = tmp_path / "extra.jsonl"  # the fine-tuned encoder's index, once built, takes over
    extra.write_text(json.dumps({"id": "n1", "question": "How is shingles treated in children?"}) + "\n")
    tuned = medfaq("index", "build", extra, "--out", indexes / "medquad-faq", "--encoder", tiny_encoder_dir)
    assert tuned.exit_code == 0, tuned.output
    after = json.loads(medfaq("search", "--json", "--mode", "bm25", "shingles").stdout)
    assert [hit["id"] for hit in after["hits"]] == ["n1"]


@takes_stage_flags(without=("threshold",))
def _flagged(first: int = 1, flags: StageFlags = NO_STAGE_FLAGS, last: str = "x") -> tuple[int, StageFlags, str]:
    return first, flags, last


def test_stage_flags_are_declared_once_and_reach_the_command():
    from typer.main import get_command

    root = get_command(app)
    declared = {name for flag in STAGE_FLAGS.values() for name in flag.option.param_decls[0].split("/")}

    def options(*path: str) -> set[str]:
        command = root
        for name in path:
            command = command.commands[name]
        return {name for param in command.params for name in [*param.opts, *param.secondary_opts]}

    assert declared <= options("search")
    assert declared - options("eval", "retrieval") == {"--top-k"}
    assert declared - options("bench") == {"--abstain", "--no-abstain", "--threshold"}
    assert options("demo") >= {"--mode", "--top-k"}

    names = list(inspect.signature(_flagged).parameters)
    aliases = ["query_source_alias0", "summary_beams_alias0"]  # --query and --beams, hidden, after their flags
    assert [name for name in names if name not in aliases] == [
        "first",
        *[name for name in STAGE_FLAGS if name != "threshold"],
        "last",
    ]
    assert names.index("query_source_alias0") == names.index("query_source") + 1
    given = dict.fromkeys(names[1:-1]) | {"rerank": True, "summary_beams_alias0": 3, "query_source_alias0": "both"}
    first, flags, last = _flagged(first=2, last="y", **given)
    assert (first, last) == (2, "y")
    applied = flags.apply(PipelineConfig(threshold=0.5))
    assert applied.rerank is True and applied.summary_beams == 3 and applied.threshold == 0.5
    assert applied.query_source == "both" and applied.summarize is True


def test_stage_flags_are_built_from_the_pipeline_settings_declarations():
    """Each flag is a PipelineConfig field's declaration: its help, and its rule as a one-line usage error."""
    settings = pipeline_settings()
    flagged = {name for name, declared in settings.items() if declared.flag}
    assert set(STAGE_FLAGS) == flagged and {"top_k", "mode", "query_source", "summary_beams"} <= flagged
    for name, option in STAGE_FLAGS.items():
        assert option.option.help == settings[name].describe()
        assert option.option.param_decls[0].split("/")[0] == settings[name].flag == "--" + name.replace("_", "-")
    for arguments, rule in (
        (["--rerank-depth", "0"], "rerank_depth must be a whole number of at least 1"),
        (["--rerank-margin", "nan"], "rerank_margin must be a finite number of at least 0"),
        (["--query", "nope"], "unknown query source 'nope'"),
        (["--rerank-precision", "fp16"], "unknown rerank precision 'fp16'"),
        (["--mode", "semantic"], "unknown mode 'semantic'"),
    ):
        assert_one_line_error(medfaq("search", *arguments, "a question"), rule)


def test_an_option_with_hidden_aliases_takes_none_for_not_given():
    """A declared default would hide the older spellings (the first value given wins): refused."""
    from medfaq.app.options import declared_option

    with pytest.raises(ValueError, match="aliases"):
        declared_option(pipeline_settings()["query_source"], with_default=True)


def test_an_abstention_says_so_before_the_hits_and_shows_them_as_the_closest_faqs(built):
    store_threshold(built, read_config(built).updated(entities=False), 2.0)  # every question abstains
    lines = medfaq("search", "--index", built, "--top-k", "2", "How is shingles treated?").stdout.splitlines()
    header = next(row for row, line in enumerate(lines) if line.split()[:2] == ["rank", "score"])
    assert lines[1:header] == [
        "no FAQ matches well enough: the question is logged for an expert",
        "the closest FAQs, none of them an answer:",
    ]
    assert len(lines) == header + 3 and not any("no FAQ matches" in line for line in lines[header:])
    response = json.loads(medfaq("search", "--index", built, "--json", "How is shingles treated?").stdout)
    assert response["abstained"] and list(response) == [
        *("query", "summary", "entities", "hits", "abstained", "timings_ms", "confidence", "truncated")
    ]


def test_queue_commands_list_link_and_undo(built):
    store_threshold(built, read_config(built).updated(entities=False), 2.0)  # every question abstains
    asked = "zzqx blorf wibble glonk"
    for _ in range(2):
        assert "no FAQ matches well enough" in medfaq("search", "--index", built, asked).stdout
    groups = json.loads(medfaq("queue", "list", "--index", built, "--json").stdout)["groups"]  # as GET /queue
    assert [(group["count"], {q["text"] for q in group["questions"]}) for group in groups] == [(2, {asked})]
    group = str(groups[0]["id"])
    linked = medfaq("queue", "link", group, "f4", "--index", built, "--by", "dr a")
    assert "2 questions linked to FAQ f4" in linked.stdout
    hits = json.loads(medfaq("search", "--index", built, "--json", "--no-abstain", asked).stdout)["hits"]
    assert hits[0]["id"] == "f4"
    assert json.loads(medfaq("queue", "list", "--index", built, "--json").stdout) == {"groups": []}  # nothing waits
    assert_one_line_error(medfaq("queue", "link", group, "f5", "--index", built), "already linked")
    assert "waits again" in medfaq("queue", "undo", group, "--index", built).stdout
    question = str(groups[0]["questions"][0]["id"])
    assert ": 1 question split from group" in medfaq("queue", "split", group, question, "--index", built).stdout
    assert_one_line_error(
        medfaq("queue", "list", "--index", built, "--status", "lost"),
        "unknown --status 'lost'; choose one of waiting, linked, answered, all",
    )
    assert_one_line_error(medfaq("queue", "merge", group, "--index", built), "at least two")


def test_a_queue_belongs_to_its_index_and_undo_never_touches_another(tmp_path, built):
    import shutil

    from medfaq.index.faq_index import FaqIndex
    from medfaq.retriever.pipeline_file import read_config, store_threshold

    store_threshold(built, read_config(built).updated(entities=False), 2.0)  # every question abstains
    copy = shutil.copytree(built, tmp_path / "idx3")
    groups = {}
    for index, asked in ((built, "zzqx blorf wibble"), (copy, "glonk frobble quux")):
        medfaq("search", "--index", index, asked)
        [group] = json.loads(medfaq("queue", "list", "--index", index, "--json").stdout)["groups"]
        assert [q["text"] for q in group["questions"]] == [asked]  # the other index's question is not in its queue
        groups[index] = str(group["id"])
        assert medfaq("queue", "link", groups[index], "f4", "--index", index).exit_code == 0
    phrasings = FaqIndex.load(built).phrasings()
    assert_one_line_error(medfaq("queue", "undo", groups[copy], "--index", built), "belongs to another index")
    assert_one_line_error(medfaq("queue", "split", groups[copy], "1", "--index", built), "belongs to another index")
    assert FaqIndex.load(built).phrasings() == phrasings
    for index in (built, copy):
        assert "waits again" in medfaq("queue", "undo", groups[index], "--index", index).stdout
        assert FaqIndex.load(index).phrasings() == []


def test_feedback_training_needs_the_faq_task_and_an_index(tmp_path, built):
    assert_one_line_error(
        medfaq("train", "biencoder", "--task", "mqp", "--feedback-index", built, "--out", tmp_path / "m"),
        "--feedback learns which FAQ answers a question: it needs --task faq",
    )
    assert_one_line_error(
        medfaq("train", "biencoder", "--task", "faq", "--feedback", "--out", tmp_path / "m"), "no --index given"
    )
    assert_one_line_error(
        medfaq(
            "train", "biencoder", "--task", "faq", "--feedback-index", tmp_path / "nothing", "--out", tmp_path / "m"
        ),
        "index directory not found",
    )


def test_allow_public_writes_needs_allow_writes(built):
    assert_one_line_error(medfaq("serve", "--index", built, "--allow-public-writes"), "give both")
