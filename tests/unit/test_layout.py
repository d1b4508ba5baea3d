"""The tree reads as the data flow: no import (top-level or inside a function) runs from a lower stage to a
higher one, and sibling stages never import each other. docs/architecture.md draws the same picture."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("tracing", "perfmodel", "pipeline", "dashboards", "mxperf")

# (stage, rank, module prefixes). A module may import its own stage, or a stage of lower rank.
STAGES: list[tuple[str, int, tuple[str, ...]]] = [
    ("tracing.outputs", 0, ("tracing.outputs",)),
    ("tracing.ingest", 1, ("tracing.ingest",)),
    ("tracing.capture", 1, ("tracing.capture",)),
    ("tracing.analysis", 2, ("tracing.analysis",)),
    ("tracing", 3, ("tracing.jobs", "tracing.streamed", "tracing.progress", "tracing.facade", "tracing")),
    # perfmodel by stage folder: inputs and kernels (the two ground floors) -> fitting -> breakeven -> step ->
    # report; api / simstudy on top
    ("perfmodel.inputs", 10, ("perfmodel.inputs",)),
    ("perfmodel.kernels", 10, ("perfmodel.kernels",)),
    ("perfmodel.fitting", 11, ("perfmodel.fitting",)),
    ("perfmodel.breakeven", 12, ("perfmodel.breakeven",)),
    ("perfmodel.step", 13, ("perfmodel.step",)),
    ("perfmodel.report", 14, ("perfmodel.report",)),
    ("perfmodel", 15, ("perfmodel.api", "perfmodel.simstudy", "perfmodel")),
    ("pipeline.base", 10, ("pipeline.quant", "pipeline.interfaces", "pipeline.device", "pipeline")),
    ("pipeline.model", 11, ("pipeline.model",)),
    ("pipeline.learner", 12, ("pipeline.learner",)),
    ("pipeline.sampler", 12, ("pipeline.sampler",)),
    ("pipeline.sync", 13, ("pipeline.sync",)),
    ("pipeline.engines", 14, ("pipeline.engines",)),
    ("pipeline.experiments", 15, ("pipeline.experiments",)),
    ("dashboards", 20, ("dashboards",)),
    ("mxperf.commands", 30, ("mxperf.commands",)),
    ("mxperf", 31, ("mxperf",)),
]
# perfmodel and pipeline are two branches of one floor: neither imports the other.
BRANCHES = ("perfmodel", "pipeline")


def stage_of(module: str) -> tuple[str, int]:
    best: tuple[str, int, int] | None = None
    for name, rank, prefixes in STAGES:
        for prefix in prefixes:
            inside = module == prefix or module.startswith(prefix + ".")
            if inside and (best is None or len(prefix) > best[2]):
                best = (name, rank, len(prefix))
    if best is None:
        raise AssertionError(
            f"{module}: not in any stage of tests/unit/test_layout.py (add it where it belongs)"
        )
    return best[0], best[1]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            out.append((node.lineno, target))
            # ``from pkg import submodule``: the submodule is what is imported
            out += [
                (node.lineno, f"{target}.{a.name}") for a in node.names if _is_module(f"{target}.{a.name}")
            ]
    return [(line, mod) for line, mod in out if mod.split(".")[0] in PACKAGES]


def _is_module(dotted: str) -> bool:
    p = ROOT / Path(*dotted.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def test_every_module_belongs_to_a_stage() -> None:
    for path in _sources():
        stage_of(module_name(path))


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_never_run_up_the_data_flow(path: Path) -> None:
    me = module_name(path)
    my_stage, my_rank = stage_of(me)
    bad = []
    for line, target in imports_of(path):
        stage, rank = stage_of(target)
        if stage == my_stage:
            continue
        up = rank > my_rank
        sideways = rank == my_rank
        mine, theirs = me.split(".")[0], target.split(".")[0]
        other_branch = mine in BRANCHES and theirs in BRANCHES and mine != theirs
        if up or sideways or other_branch:
            bad.append(f"{path.relative_to(ROOT)}:{line} {my_stage} -> {stage} ({target})")
    assert not bad, "imports against the data flow:\n" + "\n".join(bad)


def test_the_stage_order_is_the_data_flow() -> None:
    assert stage_of("tracing.analysis.metrics")[1] < stage_of("mxperf.commands.ingest")[1]
    assert stage_of("pipeline.sampler.engine")[1] == stage_of("pipeline.learner.engine")[1]
    assert stage_of("pipeline.sampler.engine")[0] != stage_of("pipeline.learner.engine")[0]


def test_every_module_says_what_it_is_for_in_two_lines() -> None:
    # the docstring's first paragraph is the module's purpose; design detail may follow, history may not
    bad = []
    for path in _sources():
        doc = ast.get_docstring(ast.parse(path.read_text()))
        rel = path.relative_to(ROOT)
        if not doc:
            bad.append(f"{rel}: no module docstring")
        elif len(doc.split("\n\n")[0].splitlines()) > 2:
            bad.append(f"{rel}: the first paragraph of its docstring runs past two lines")
    assert not bad, "\n".join(bad)


def _type_checking_lines(path: Path) -> set[int]:
    """Lines inside ``if TYPE_CHECKING:`` blocks (imports there never run)."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for sub in node.body:
                lines.update(range(sub.lineno, (sub.end_lineno or sub.lineno) + 1))
    return lines


def _module_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports (module level and inside functions, not under
    ``TYPE_CHECKING``; packages' own ``__init__`` left out: they only re-export)."""
    graph: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        if path.name == "__init__.py":
            continue
        me, skip = module_name(path), _type_checking_lines(path)
        graph[me] = {
            t
            for line, t in imports_of(path)
            if line not in skip
            and (ROOT / (t.replace(".", "/") + ".py")).is_file()
            and t.startswith(package + ".")
        } - {me}
    return graph


@pytest.mark.parametrize("package", ["tracing", "perfmodel", "dashboards"])
def test_no_import_circles_inside_a_package(package: str) -> None:
    """A module never imports, directly or through others, a module that imports it (lazy imports included)."""
    graph = _module_graph(package)
    state: dict[str, int] = {}
    stack: list[str] = []
    circles: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph.get(m, ())):
            if state.get(t) == 1:
                circles.append(" -> ".join([*stack[stack.index(t) :], t]))
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not circles, "import circles:\n" + "\n".join(circles)
