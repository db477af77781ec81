"""The house's shape: every module imports in a fresh interpreter, packages import only the packages below them
(and, inside them, the subpackages keep to their own rules), none imports the experiment scripts, and no module
reaches itself through its imports (those inside functions included)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAYERS = ["common", "index", "summarizer", "retriever", "eval", "app"]
"""Bottom to top; `index` and `summarizer` share a level: neither imports the other."""
ALLOWED = {
    "common": set(),
    "index": {"common"},
    "summarizer": {"common"},
    "retriever": {"common", "index", "summarizer"},
    "eval": {"common", "index", "summarizer", "retriever"},
    "app": {"common", "index", "summarizer", "retriever", "eval"},
}
CONFINED = {"medfaq.index.onnx": ("medfaq.index.onnx", "medfaq.index.model_files")}
"""Subpackage -> the only modules of its package it imports: the ONNX backend sits below the rest of `index`, so
both the bi-encoder and the cross-encoder build on it."""
APART = [("medfaq.retriever.queue", "medfaq.retriever.reranker")]
"""Sibling subpackages neither of which imports the other: the experts' queue and a model family."""
SEARCH_PATH = (
    "retriever.pipeline",
    "retriever.search",
    "retriever.model_cache",
    "retriever.pipeline_file",
    "retriever.stages",
)
"""The online path of a question: what `medfaq search`, the server and the demo load to answer one."""
OFF_THE_SEARCH_PATH = ("app", "eval", "retriever.decisions", "retriever.queue.question_queue", "summarizer.training")
"""What the search path never reaches, through any chain of imports: the set-up recipe and the commands, the
evaluation, the per-index decisions, the experts' queue, training (a model family's `training`, `losses`,
`distill*`, `adapted` modules, and the shared training loop and data)."""
SEARCH_PATH_MAY_REACH = ("retriever.decisions.encoder_rule", "retriever.training.config")
"""The encoder rule (`--encoder auto` applies it) and the training config every saved model carries."""
TRAINING_MODULES = ("training", "losses", "distill", "distill_data", "adapted", "loop", "pair_data", "pair_models")
NOT_IMPORTED = {"medfaq.app.__main__", "medfaq.app.streamlit_app"}  # scripts: importing them runs them


def module_files() -> dict[str, Path]:
    """`medfaq.<package>.<module>` -> its file, for every module of the installed packages' folders."""
    modules = {}
    for package in LAYERS:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(["medfaq", *parts])] = path
    return modules


def imported_names(path: Path) -> set[str]:
    """The absolute names a file imports anywhere (at the top or inside functions); `from a import b` gives `a` and
    `a.b`."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.update([node.module, *(f"{node.module}.{alias.name}" for alias in node.names)])
    return names


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the medfaq modules it imports anywhere in its file (at the top or inside functions)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        imported: set[str] = set()
        for target in imported_names(path):
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                imported.add(target)
        graph[name] = imported
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        order[node] = low[node] = len(order)
        stack.append(node)
        for target in graph[node]:
            if target not in order:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], order[target])
        if low[node] == order[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in order:
            visit(node)
    return found


def test_packages_import_only_the_packages_below_them():
    graph = import_graph(module_files())
    upward = sorted(
        f"{source} -> {target}"
        for source, targets in graph.items()
        for target in targets
        if target.split(".")[1] != source.split(".")[1] and target.split(".")[1] not in ALLOWED[source.split(".")[1]]
    )
    assert not upward


def test_the_package_never_imports_the_experiment_scripts():
    """`experiments/` is not installed with medfaq: the package runs without it."""
    reaching = sorted(
        f"{name} -> {target}"
        for name, path in module_files().items()
        for target in imported_names(path)
        if target.partition(".")[0] == "experiments"
    )
    assert not reaching


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_subpackages_keep_to_their_rules():
    graph = import_graph(module_files())
    confined = sorted(
        f"{source} -> {target}"
        for package, allowed in CONFINED.items()
        for source, targets in graph.items()
        if _inside(source, package)
        for target in targets
        if target.split(".")[1] == source.split(".")[1] and not any(_inside(target, ok) for ok in allowed)
    )
    crossing = sorted(
        f"{source} -> {target}"
        for pair in APART
        for here, there in (pair, pair[::-1])
        for source, targets in graph.items()
        if _inside(source, here)
        for target in targets
        if _inside(target, there)
    )
    assert not confined and not crossing
    assert all(any(_inside(name, package) for name in graph) for package in [*CONFINED, *sum(APART, ())])


def test_the_search_path_reaches_no_training_decision_or_set_up():
    graph = import_graph(module_files())
    reached: set[str] = set()
    stack = [name for name in graph if any(_inside(name, f"medfaq.{part}") for part in SEARCH_PATH)]
    while stack:
        for target in graph[stack.pop()] - reached:
            reached.add(target)
            stack.append(target)
    allowed = {f"medfaq.{name}" for name in SEARCH_PATH_MAY_REACH}
    off_path = sorted(
        name
        for name in reached - allowed
        if any(_inside(name, f"medfaq.{part}") for part in OFF_THE_SEARCH_PATH)
        or name.rpartition(".")[2] in TRAINING_MODULES
        or ".training." in name
    )
    assert not off_path
    assert "medfaq.retriever.pipeline" in graph and "medfaq.retriever.trained_models" in reached


def test_no_module_imports_itself_through_others():
    assert not cycles(import_graph(module_files()))


def test_every_module_imports_in_a_fresh_interpreter(tmp_path):
    """Imported from outside the checkout, so only the installed `medfaq` namespace can be found."""
    names = sorted(set(module_files()) - NOT_IMPORTED)
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\n"
    done = subprocess.run(
        [sys.executable, "-c", code, *names], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_graph_finds_a_cycle_and_an_upward_import(tmp_path):
    """The checks above are only as good as the graph: a made-up circle and an upward arrow are both seen."""
    graph = {"medfaq.index.a": {"medfaq.index.b"}, "medfaq.index.b": {"medfaq.index.a"}, "medfaq.common.c": set()}
    assert cycles(graph) == [["medfaq.index.a", "medfaq.index.b"]]
    (tmp_path / "m.py").write_text("def f():\n    from medfaq.app.cli import main\n", encoding="utf-8")
    modules = {"medfaq.common.m": tmp_path / "m.py", "medfaq.app.cli": tmp_path / "m.py"}
    assert import_graph(modules)["medfaq.common.m"] == {"medfaq.app.cli"}
    (tmp_path / "e.py").write_text("def f():\n    from experiments.plots import main\n", encoding="utf-8")
    assert "experiments.plots" in imported_names(tmp_path / "e.py")
