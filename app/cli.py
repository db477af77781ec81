"""The `medfaq` command line: thin typer wrappers around the packages; no algorithms live here."""

from __future__ import annotations

import sys
from typing import Any

import typer
from typer.core import TyperGroup

from medfaq.common.runtime import MedfaqError, configure_logging, one_line
from medfaq.retriever.trained_models import ModelNotTrained

try:  # typer >= 0.26 carries its own copy of click
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover - older typer on click itself
    from click import exceptions as click_errors


class OneLineErrors(TyperGroup):
    """Every user error is one line on stderr, never a box or a traceback (also under CliRunner): a MedfaqError
    raised by a command or a click usage error (bad option value, unknown option, missing argument) prints
    `error: ...` and exits 2; Ctrl-C prints `interrupted` and exits 130."""

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except MedfaqError as error:
            if not_trained(error):  # `main` offers to train it and runs the command again
                raise
            typer.echo(f"error: {one_line(str(error))}", err=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            typer.echo("interrupted", err=True)
            raise typer.Exit(130) from None

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        try:
            try:
                result = super().main(*args, standalone_mode=False, **kwargs)
            except MedfaqError as error:
                missing = not_trained(error)
                if missing is None:
                    raise
                cmd_setup.train_on_first_need(missing, GLOBAL_OPTIONS["yes"])  # then the command runs again
                result = super().main(*args, standalone_mode=False, **kwargs)
        except MedfaqError as error:
            typer.echo(f"error: {one_line(str(error))}", err=True)
            result = 2
        except typer.Exit as stop:  # a training on first need failed: its step said why
            result = stop.exit_code
        except getattr(click_errors, "NoArgsIsHelpError", ()) as error:
            error.show()
            result = error.exit_code
        except click_errors.UsageError as error:
            hint = f" (see '{error.ctx.command_path} --help')" if error.ctx is not None else ""
            typer.echo(f"error: {one_line(error.format_message())}{hint}", err=True)
            result = error.exit_code
        except click_errors.ClickException as error:
            typer.echo(f"error: {one_line(error.format_message())}", err=True)
            result = error.exit_code
        except typer.Abort:
            typer.echo("interrupted", err=True)
            result = 130
        code = result if isinstance(result, int) else 0
        if not standalone_mode:
            return code
        sys.exit(code)


def not_trained(error: BaseException | None) -> ModelNotTrained | None:
    """The set-up model missing behind `error` (a stage's load wraps it), if that is what it is."""
    while error is not None and not isinstance(error, ModelNotTrained):
        error = error.__cause__
    return error


app = typer.Typer(
    cls=OneLineErrors,
    name="medfaq",
    help="Medical FAQ retrieval: summarize consumer health questions, search and rerank FAQs, evaluate.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
data_app = typer.Typer(help="Fetch datasets, find duplicates, make and audit benchmarks.", no_args_is_help=True)
index_app = typer.Typer(help="Build and maintain FAQ indexes.", no_args_is_help=True)
train_app = typer.Typer(help="Train the summarizer and the encoders.", no_args_is_help=True)
eval_app = typer.Typer(help="Evaluate the summarizer, the duplicate detector and retrieval.", no_args_is_help=True)
app.add_typer(data_app, name="data")
app.add_typer(index_app, name="index")
app.add_typer(train_app, name="train")
queue_app = typer.Typer(
    help="The experts' queue: the questions medfaq abstained on, grouped; answer each group once.", no_args_is_help=True
)
models_app = typer.Typer(
    help="The trained models in one file: export them where they were trained, import them where they serve.",
    no_args_is_help=True,
)
app.add_typer(eval_app, name="eval")
app.add_typer(queue_app, name="queue")
app.add_typer(models_app, name="models")


from medfaq.app import (  # noqa: E402  (after the sub-apps they join)
    cmd_data,
    cmd_demo,
    cmd_eval,
    cmd_index,
    cmd_models,
    cmd_queue,
    cmd_search,
    cmd_serve,
    cmd_setup,
    cmd_summarize,
    cmd_train,
)

# Each group's commands live in the module named after it; this list is the one place they are registered, in the
# order `--help` shows them.
app.command("search")(cmd_search.search)
app.command("bench")(cmd_search.bench)
app.command("demo")(cmd_demo.demo)
app.command("setup")(cmd_setup.setup)
app.command("serve")(cmd_serve.serve)
app.command("summarize")(cmd_summarize.summarize)
data_app.command("fetch")(cmd_data.fetch)
data_app.command("list")(cmd_data.list_datasets)
data_app.command("dedup")(cmd_data.dedup)
data_app.command("make-benchmark")(cmd_data.make_benchmark)
data_app.command("split-benchmark")(cmd_data.split_benchmark)
data_app.command("audit")(cmd_data.audit)
index_app.command("build")(cmd_index.build)
index_app.command("add")(cmd_index.add)
index_app.command("delete")(cmd_index.delete)
index_app.command("info")(cmd_index.info)
index_app.command("migrate")(cmd_index.migrate)
index_app.command("adapt")(cmd_index.adapt)
index_app.command("likelihood")(cmd_index.likelihood)
index_app.command("rerank")(cmd_index.rerank)
train_app.command("summarizer")(cmd_train.train_summarizer)
train_app.command("question-writer")(cmd_train.train_question_writer)
train_app.command("average")(cmd_train.average)
train_app.command("biencoder")(cmd_train.train_command("biencoder"))
train_app.command("crossencoder")(cmd_train.train_command("crossencoder"))
train_app.command("student")(cmd_train.train_student)
train_app.command("calibrate")(cmd_train.calibrate)
eval_app.command("summarizer")(cmd_eval.eval_summarizer)
eval_app.command("duplicates")(cmd_eval.eval_duplicates)
eval_app.command("retrieval")(cmd_eval.eval_retrieval)
queue_app.command("list")(cmd_queue.list_groups)
queue_app.command("link")(cmd_queue.link)
queue_app.command("answer")(cmd_queue.answer)
queue_app.command("split")(cmd_queue.split)
queue_app.command("merge")(cmd_queue.merge)
queue_app.command("undo")(cmd_queue.undo)
models_app.command("export")(cmd_models.export)
models_app.command("import")(cmd_models.import_file)
models_app.command("list")(cmd_models.list_models)


GLOBAL_OPTIONS = {"yes": False}


@app.callback()
def _global_options(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log progress details to stderr."),
    yes: bool = typer.Option(
        False,
        "--yes",
        "-y",
        help="Train a model the command needs and `medfaq setup` left out without asking (for scripts).",
    ),
) -> None:
    configure_logging(verbose)
    GLOBAL_OPTIONS["yes"] = yes


def main() -> None:
    """Entry point: user errors become one line on stderr and a non-zero exit code, never a traceback."""
    try:
        app()
    except MedfaqError as error:
        typer.echo(f"error: {one_line(str(error))}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
