"""A stage is one module and one line in the registry: a stage declared here, and registered, reaches the config,
pipeline.json, the pipeline, the command line's flags and the HTTP request model, with no other file changed."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from medfaq.common.runtime import MedfaqError
from medfaq.common.settings import setting
from medfaq.index.faq_index import FaqIndex
from medfaq.retriever.pipeline import Pipeline, PipelineConfig, pipeline_settings
from medfaq.retriever.pipeline_file import read_config, write_config
from medfaq.retriever.stages import STAGES
from medfaq.retriever.stages.base import Batch, Stage, StageRun, reranked

REPO = Path(__file__).resolve().parents[1]
QUESTION = "How is shingles treated?"


@dataclass(frozen=True)
class ReverseSettings:
    on: bool = setting(False, help="Reverse the top hits.", flag=True, request=True)
    depth: int = setting(3, help="How many top hits are reversed.", flag=True, ge=1, request=True)


class ReverseStage(Stage):
    """Reverses the order of each question's top `depth` hits."""

    name = "reverse"
    settings = ReverseSettings

    def depth(self, settings: ReverseSettings) -> int:
        return settings.depth

    def run(self, stage_object: None, settings: ReverseSettings, batch: Batch, pipeline: StageRun) -> None:
        with pipeline.timed(self.name, batch.timings, lock=False):
            batch.hits = [reranked([*hits[: settings.depth][::-1], *hits[settings.depth :]]) for hits in batch.hits]


REGISTER = "from medfaq.retriever.stages import STAGES; from tests.test_stage_registry import ReverseStage; "
REGISTER += "STAGES.append(ReverseStage())"


@pytest.fixture
def reverse_stage():
    stage = ReverseStage()
    STAGES.append(stage)
    yield stage
    STAGES.remove(stage)


@pytest.fixture
def index(faq_records, tiny_encoder):
    return FaqIndex.build(faq_records, tiny_encoder, progress=False)


def test_a_registered_stage_reaches_the_config_pipeline_json_and_the_pipeline(reverse_stage, index, tmp_path):
    declared = pipeline_settings()
    assert declared["reverse"].flag == "--reverse" and declared["reverse_depth"].setting.request
    config = PipelineConfig(mode="dense", top_k=5, reverse=True, reverse_depth=4)
    assert config.stage("reverse") == ReverseSettings(on=True, depth=4) and config.reverse_depth == 4
    assert config.to_dict()["reverse_depth"] == 4 and PipelineConfig.from_dict(config.to_dict()) == config
    with pytest.raises(MedfaqError, match="^reverse_depth must be a whole number of at least 1, got 0$"):
        config.replace(reverse_depth=0)

    write_config(tmp_path, config)
    saved = json.loads((tmp_path / "pipeline.json").read_text(encoding="utf-8"))
    assert saved["stages"]["reverse"] == {"on": True, "depth": 4}
    assert read_config(tmp_path) == config

    retrieved = Pipeline(index, config.replace(reverse=False)).run(QUESTION)
    reversed_ = Pipeline(index, config).run(QUESTION)
    ids = [hit.id for hit in retrieved.hits]
    assert [hit.id for hit in reversed_.hits] == ids[:4][::-1] + ids[4:]
    assert [hit.rank for hit in reversed_.hits] == list(range(1, 6)) and "reverse" in reversed_.timings_ms


def test_a_registered_stage_reaches_the_command_line_and_the_http_request():
    script = f"""{REGISTER}
from typer.testing import CliRunner
from medfaq.app.cli import app
from medfaq.app.options import STAGE_FLAGS
from medfaq.app.server import SearchRequest
print(sorted(set(STAGE_FLAGS) & {{"reverse", "reverse_depth"}}))
print(sorted(set(SearchRequest.model_fields) & {{"reverse", "reverse_depth"}}))
shown = CliRunner().invoke(app, ["search", "--help"], env={{"COLUMNS": "200"}}).output
print("--reverse-depth" in shown, "--no-reverse" in shown)
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == ["['reverse', 'reverse_depth']"] * 2 + ["True True"]
