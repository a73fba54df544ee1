"""The tree shows the architecture (ARCHITECTURE.md): a small library root, one package per family
under ``algorithms/``, imports that run one way, and no hidden function-level imports."""

import ast
import pathlib

import pytest

LIB = pathlib.Path(__file__).resolve().parents[2] / "fedbayes_flwr"
FAMILY_NAMES = {"pvi", "dsvgd", "svgd", "amps", "pdmc", "pdmp", "dhmc", "gossip"}
FAMILIES = ("pvi", "dsvgd", "amps", "pdmc", "dhmc")
# The only function-level imports between library modules: modules whose import is heavy.
LAZY = {"fedbayes_flwr.inference.vi": "imports TensorFlow (the CLI and the registry must not)",
        "fedbayes_flwr.evaluation.plots": "imports matplotlib (only when a run writes its plots)",
        "fedbayes_flwr.api": "imports TensorFlow (the package re-exports fit/load lazily)",
        "fedbayes_flwr.comparison": "imports TensorFlow (the package re-exports compare lazily)",
        "fedbayes_flwr.comparison.figure": "imports matplotlib (only for compare.png)"}
# Layers, lowest first; a module may import its own layer or a lower one only. The package's own
# __init__ re-exports the API (lazily, typed under TYPE_CHECKING): it sits with it, on top.
LAYERS = [("errors", "seeds"), ("inference",), ("data", "evaluation"), ("models",),
          ("algorithms",), ("codec", "runtime"), ("deploy",), ("api", "comparison", "__init__")]


def _modules() -> dict[str, pathlib.Path]:
    return {".".join(("fedbayes_flwr", *p.relative_to(LIB).with_suffix("").parts)): p
            for p in LIB.rglob("*.py")}


def _imports(path: pathlib.Path, functions_only: bool = False):
    tree = ast.parse(path.read_text())
    scopes = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    for scope in scopes if functions_only else [tree]:
        for node in ast.walk(scope):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    yield node.lineno, node.module, alias.name
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    yield node.lineno, alias.name, None


def _target(module: str, name: str | None, mods: dict) -> str | None:
    if name and f"{module}.{name}" in mods:
        return f"{module}.{name}"
    return module if module in mods else None


def _layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    for rank, names in enumerate(LAYERS):
        if top in names:
            return rank
    raise AssertionError(f"{module}: not in a known layer {LAYERS}")


def test_library_root_is_the_ground_floor():
    root = sorted(p.name for p in LIB.glob("*.py"))
    assert len(root) <= 8, root
    assert set(root) <= {"__init__.py", "errors.py", "seeds.py", "codec.py", "api.py"}, root


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_is_one_package(family):
    package = LIB / "algorithms" / family
    assert (package / "__init__.py").is_file() and (package / "bundle.py").is_file()


def test_no_family_named_module_outside_algorithms():
    outside = [str(p.relative_to(LIB)) for p in LIB.rglob("*")
               if p.relative_to(LIB).parts[0] != "algorithms"
               and (p.stem if p.suffix == ".py" else p.name) in FAMILY_NAMES]
    assert not outside, outside


def test_no_import_cycle_and_no_self_import():
    mods = _modules()
    graph = {m: set() for m, p in mods.items() if p.name != "__init__.py"}
    for m in graph:
        for _, module, name in _imports(mods[m]):
            target = _target(module, name, mods)
            assert target != m, f"{m} imports itself"
            if target and mods[target].name != "__init__.py":
                graph[m].add(target)
    state: dict[str, int] = {}

    def visit(u, stack):
        state[u] = 1
        for v in sorted(graph[u]):
            assert state.get(v) != 1, "import cycle: " + " -> ".join(stack[stack.index(v):] + [v])
            if v not in state:
                visit(v, [*stack, v])
        state[u] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_imports_run_one_way():
    mods = _modules()
    wrong = []
    for m, path in mods.items():
        if m == "fedbayes_flwr":
            continue
        for line, module, name in _imports(path):
            target = _target(module, name, mods)
            if target and target != "fedbayes_flwr" and _layer(target) > _layer(m):
                wrong.append(f"{m}:{line} imports {target}")
    assert not wrong, wrong


def test_function_level_imports_are_only_the_documented_heavy_ones():
    mods = _modules()
    hidden = [f"{m}:{line} imports {module}" for m, path in mods.items()
              for line, module, name in _imports(path, functions_only=True)
              if module.startswith("fedbayes_flwr") and module not in LAZY]
    assert not hidden, hidden
