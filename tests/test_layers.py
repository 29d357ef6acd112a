"""The package is layered: every module under src/tepo imports only its own layer or the layers below, and the
top-level units (subpackages and modules) import each other without cycles.

Layers, bottom to top:

- library: losses, advantages, logprobs (and prompt_cache), rewards, data, models, rollout, metrics, checkpoint (and the small
  helpers batch, passk, the preset files in configs),
- config: the run configuration, which validates itself against the library's registries,
- train: training (and the old train.py), evaluate, integrations (TRL / verl adapters),
- compare / report: comparisons of runs and the reports of them (report reads comparison directories),
- cli: ``tepo.cli``, the package root, and every ``cli`` module of a subpackage (``tepo.compare.cli`` ...): a
  command may call anything.

Imports are read with ``ast`` from every file, including the ones inside functions (the lazy imports that keep
``tepo --help`` fast are imports all the same).

The tests are held to one rule of the same kind: no file under tests/ imports a test module; what tests share
lives in conftest.py (fixtures) and in the builder modules beside it (helpers.py, verl_runner.py, trl_runner.py,
loss_cases.py, correction_cases.py, update_runs.py, scripted_collect.py, verl_batch.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

LAYERS: list[tuple[str, frozenset[str]]] = [
    (
        "library",
        frozenset(
            {
                "losses",
                "advantages",
                "logprobs",
                "prompt_cache",  # the shared-prompt pass of logprobs
                "rewards",
                "data",
                "models",
                "rollout",
                "lora",
                "hub",
                "device",  # train.device resolution: torch only
                "precision",  # precision auto: the CPU's flags / the GPU, torch only
                "files",  # the atomic-write helper: the standard library only
                "metrics",
                "checkpoint",
                "batch",
                "passk",
                "configs",
            }
        ),
    ),
    ("config", frozenset({"config"})),
    ("train", frozenset({"training", "train", "evaluate", "integrations"})),
    ("compare/report", frozenset({"compare", "report"})),
    ("cli", frozenset({"cli", "__main__", "", "env_report"})),  # env_report: `tepo env`, reads every layer
]

# Known upward imports, each with the reason it is still there. The test fails on any import not listed here,
# and on a listed one that has gone (so the list cannot go stale).
KNOWN_UPWARD: dict[tuple[str, str], str] = {}


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, src: Path, modules: set[str]) -> set[str]:
    """The ``tepo`` modules a file imports, anywhere in it (module level, functions, ``TYPE_CHECKING`` blocks).

    ``from tepo.x import y`` counts as an import of ``tepo.x.y`` when that is a module, else of ``tepo.x``.
    """
    name = module_name(path, src)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in modules else target)
    return {m for m in found if m == "tepo" or m.startswith("tepo.")}


def unit_of(module: str) -> str:
    """The top-level unit a module belongs to: its first name under ``tepo``; any ``*.cli`` module is ``cli``."""
    parts = module.split(".")
    if parts[-1] == "cli":
        return "cli"
    return parts[1] if len(parts) > 1 else ""


def layer_of(unit: str) -> int:
    for index, (_, units) in enumerate(LAYERS):
        if unit in units:
            return index
    raise KeyError(unit)


def module_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Each module under ``src/tepo`` -> the ``tepo`` modules it imports."""
    files = sorted((src / "tepo").rglob("*.py"))
    modules = {module_name(p, src) for p in files}
    return {module_name(p, src): imports_of(p, src, modules) for p in files}


def upward_imports(graph: dict[str, set[str]]) -> dict[tuple[str, str], str]:
    """``(importer unit, imported unit) -> example edge`` for every import from a lower layer into a higher one."""
    found: dict[tuple[str, str], str] = {}
    for module, targets in graph.items():
        for target in targets:
            low, high = unit_of(module), unit_of(target)
            if layer_of(high) > layer_of(low):
                found.setdefault((f"tepo.{low}", f"tepo.{high}"), f"{module} imports {target}")
    return found


def unit_cycles(graph: dict[str, set[str]], ignore: set[tuple[str, str]] = frozenset()) -> list[list[str]]:
    """Cycles among top-level units (Tarjan's strongly connected components of size > 1)."""
    edges: dict[str, set[str]] = {}
    for module, targets in graph.items():
        for target in targets:
            a, b = unit_of(module), unit_of(target)
            if a != b and (f"tepo.{a}", f"tepo.{b}") not in ignore:
                edges.setdefault(a, set()).add(b)
            edges.setdefault(b, set())
    return strong_components(edges)


def module_cycles(graph: dict[str, set[str]], src: Path = SRC) -> list[list[str]]:
    """Cycles among modules (inside a unit as well), imports of a package itself (its ``__init__``, which
    re-exports its modules) left out: ``registry`` importing ``frameworks`` importing ``registry`` is one."""
    packages = {m for m in graph if (src / m.replace(".", "/") / "__init__.py").exists()}
    edges = {m: {t for t in targets if t in graph and t not in packages} for m, targets in graph.items()}
    return strong_components(edges)


def strong_components(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of size > 1 of a graph (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return components


def test_every_module_has_a_layer():
    missing = sorted({unit_of(m) for m in module_graph()} - {u for _, units in LAYERS for u in units})
    assert not missing, f"top-level units with no layer in tests/test_layers.py LAYERS: {missing}"


def test_no_module_imports_a_higher_layer():
    found = upward_imports(module_graph())
    new = {edge: example for edge, example in found.items() if edge not in KNOWN_UPWARD}
    assert not new, "imports from a higher layer:\n" + "\n".join(
        f"  {a} -> {b}: {example}" for (a, b), example in sorted(new.items())
    )
    gone = sorted(set(KNOWN_UPWARD) - set(found))
    assert not gone, f"KNOWN_UPWARD lists imports that no longer exist (remove them): {gone}"


def test_no_cycles_between_top_level_units():
    cycles = unit_cycles(module_graph(), ignore=set(KNOWN_UPWARD))
    assert not cycles, f"import cycles between top-level units: {cycles}"


def test_no_cycles_between_modules():
    """Lazy imports included: a function-level import that closes a circle is a dependency the wrong way (#45)."""
    assert module_cycles(module_graph()) == []


def test_module_cycles_finds_a_lazy_circle():
    graph = {
        "tepo.advantages": {"tepo.advantages.registry"},
        "tepo.advantages.registry": {"tepo.advantages.frameworks"},  # the lazy import before #45
        "tepo.advantages.frameworks": {"tepo.advantages.registry", "tepo.advantages"},
    }
    assert module_cycles(graph) == [["tepo.advantages.frameworks", "tepo.advantages.registry"]]


# ----- the tests: no test module imports another ------------------------------------------------------------

TESTS = Path(__file__).resolve().parent


def imported_test_modules(root: Path = TESTS) -> dict[str, list[str]]:
    """File under ``root`` (relative path) -> the test modules (a dotted part ``test_*``) it imports, for the
    files that import any. ``from <folder> import test_x`` and ``from . import test_x`` count as well."""
    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                names.add(module)
                if (
                    not module or (root / module.replace(".", "/")).is_dir()
                ):  # a folder: its names are modules
                    names.update(f"{module}.{alias.name}".lstrip(".") for alias in node.names)
        hits = sorted(n for n in names if any(part.startswith("test_") for part in n.split(".")))
        if hits:
            found[path.relative_to(root).as_posix()] = hits
    return found


def test_no_test_module_imports_another():
    """Shared builders live in conftest.py (fixtures) and in the builder modules beside it (helpers.py,
    verl_runner.py, trl_runner.py, loss_cases.py ...), never in a test module another test imports."""
    assert imported_test_modules() == {}


# ----- the checker itself catches what it claims to -----------------------------------------------------------


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_checker_sees_imports_inside_functions_and_relative_imports(tmp_path):
    _write(
        tmp_path,
        {
            "tepo/__init__.py": "",
            "tepo/data/__init__.py": "from .tasks import make\n",
            "tepo/data/tasks.py": "def make():\n    from tepo.compare import table\n    return table\n",
            "tepo/compare/__init__.py": "",
            "tepo/compare/table.py": "from tepo.data import make\n",
            "tepo/compare/cli.py": "import tepo.report.html\n",
            "tepo/report/__init__.py": "",
            "tepo/report/html.py": "from tepo.compare.table import x\n",
        },
    )
    graph = module_graph(tmp_path)
    assert graph["tepo.data"] == {"tepo.data.tasks"}
    assert graph["tepo.data.tasks"] == {"tepo.compare.table"}  # found inside a function
    assert upward_imports(graph) == {
        ("tepo.data", "tepo.compare"): "tepo.data.tasks imports tepo.compare.table"
    }
    assert unit_cycles(graph) == [["compare", "data"]]
    # A cli module may import anything, and being the top it closes no cycle with report.
    assert not any("cli" in c or "report" in c for c in unit_cycles(graph))


def test_test_import_checker_sees_every_form(tmp_path):
    _write(
        tmp_path,
        {
            "helpers.py": "import torch\n",
            "test_a.py": "from helpers import x\n",
            "losses/test_b.py": "from test_a import y\n",
            "losses/test_c.py": "def f():\n    import test_a\n",
            "losses/test_d.py": "from losses import test_b\n",
            "losses/test_e.py": "from . import test_c\nfrom losses.test_b import z\n",
            "builder.py": "from losses.test_b import z\n",
        },
    )
    assert imported_test_modules(tmp_path) == {
        "builder.py": ["losses.test_b"],
        "losses/test_b.py": ["test_a"],
        "losses/test_c.py": ["test_a"],
        "losses/test_d.py": ["losses.test_b"],
        "losses/test_e.py": ["losses.test_b", "test_c"],
    }


@pytest.mark.parametrize("unit", ["training", "train", "evaluate"])
def test_train_layer_is_above_library_and_below_compare(unit):
    assert layer_of("data") < layer_of("config") < layer_of(unit) < layer_of("compare") < layer_of("cli")


def test_every_benchmark_script_is_listed_in_the_benchmarks_readme():
    """benchmarks/README.md's table names every script and the page its results live on."""
    folder = SRC.parent / "benchmarks"
    table = (folder / "README.md").read_text(encoding="utf-8")
    scripts = sorted(p.name for p in folder.glob("*.py") if not p.name.startswith("_"))
    missing = [name for name in scripts if f"| `{name}` |" not in table]
    assert missing == [], f"benchmarks/README.md has no row for {missing}"
