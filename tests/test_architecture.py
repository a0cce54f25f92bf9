"""Dependencies point one way (docs/architecture.md): the core imports none of the parts; the
analysis imports only the core; the agent, which runs inside training processes, imports only the
standard library and the wire vocabulary the bootstrap copies beside it; the sidecar and the
operator import the analysis and the core, never each other (the sidecar also the agent, whose
files it installs); the test doubles (stepscope.testing) may import every part and no part imports
them; only the roof (stepscope.cli, stepscope.local) imports everything, and nothing imports
the roof. Outside the analysis, code imports only its facade (stepscope.analysis) and its types
(stepscope.analysis.model); inside, each stage imports only the stages before it. Checked over the
source's AST, so an import inside a function counts as much as one at the top, and no module is
executed."""
from __future__ import annotations

import ast
import operator as stdlib_operator
import subprocess
import sys
from pathlib import Path

import pytest

from stepscope.contracts.wire import CONTRACTS_MODULE

REPO = Path(__file__).resolve().parents[1]
PARTS = ("operator", "sidecar", "analysis")
# The agent's package: copied whole into training pods by the bootstrap, beside the contracts
# (under their bootstrap name), so it may import nothing else of stepscope.
AGENT = "stepscope.agent"
AGENT_MAY_IMPORT = ("stepscope.contracts",)
# The doubles the tests and benchmarks share (an API server, a GPU node, rank summaries): they
# stand in for what the parts talk to, so no part may lean on them.
TESTING = "stepscope.testing"
BOOTSTRAP_NAMES = (CONTRACTS_MODULE,)
ROOF = ("stepscope.cli", "stepscope.local")
# What each layer may import besides itself.
ALLOWED = {
    "core": set(),
    "agent": {"core"},
    "analysis": {"core"},
    "sidecar": {"core", "analysis", "agent"},
    "operator": {"core", "analysis"},
    "roof": {"core", "analysis", "sidecar", "operator", "agent"},
    "testing": {"core", "analysis", "sidecar", "operator", "agent"},
}
# Layers that must never load torch: the operator's and the analysis Job's images have none.
NO_TORCH = ("core", "analysis", "operator")
# Folders a module started in the repository root could import under a second, top-level name
# (`operator` is not among them: without an __init__.py it never wins over the standard library's).
SECOND_NAMES = ("sidecar", "analysis", "tests", "benchmarks")
# The analysis's stages (its subpackages, model.py, the types they exchange, and settings.py, what
# it reads from the environment) and which of the others each may import: each those before it. The facade (stepscope/analysis/__init__.py) and
# `stepscope analyze` (pipeline.py) sit above them all.
STAGES = {
    "settings": set(),
    "model": {"settings"},
    "loading": {"settings", "model"},
    "statistics": {"settings", "model", "loading"},
    "gathering": {"settings", "model", "loading", "statistics"},
    "diagnosis": {"settings", "model", "loading", "statistics", "gathering"},
    "reporting": {"settings", "model", "loading", "statistics", "gathering", "diagnosis"},
    "comparison": {"settings", "model", "loading", "statistics", "gathering", "diagnosis"},
}
# All the analysis that code outside it may import: the facade and the types.
ANALYSIS_FACE = ("stepscope.analysis", "stepscope.analysis.model")


def layer(module: str) -> str:
    parts = module.split(".")
    if parts[0] != "stepscope":
        raise ValueError(f"{module} is outside the package")
    if len(parts) > 1 and parts[1] in PARTS:
        return parts[1]
    if module == AGENT or module.startswith(AGENT + "."):
        return "agent"
    if module == TESTING or module.startswith(TESTING + "."):
        return "testing"
    if any(module == roof or module.startswith(roof + ".") for roof in ROOF):
        return "roof"
    return "core"


def stage(module: str) -> str:
    """The analysis stage a module of stepscope.analysis belongs to ("top": the facade, the pipeline)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[2] in STAGES else "top"


def module_name(path: Path) -> str:
    """The import name of a source file: its path below the repository (stepscope/operator/kube.py
    is stepscope.operator.kube)."""
    names = list(path.relative_to(REPO).with_suffix("").parts)
    if names[-1] == "__init__":
        names.pop()
    return ".".join(names)


def is_module(name: str) -> bool:
    """A module or package of the repository (what `from stepscope.contracts import layout` names)."""
    path = REPO.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports(path: Path, module: str) -> set[str]:
    """Every module `path` imports, absolute, wherever in the file the import sits."""
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            found.add(base)
            # `from stepscope.contracts import layout` imports the module stepscope.contracts.layout
            found.update(f"{base}.{alias.name}" for alias in node.names if is_module(f"{base}.{alias.name}"))
    return found


def sources() -> dict[str, Path]:
    return {module_name(p): p for p in (REPO / "stepscope").rglob("*.py")}


def graph() -> dict[str, set[str]]:
    return {module: imports(path, module) for module, path in sources().items()}


def agent_may_import(target: str) -> bool:
    """The standard library, torch (once the program imported it), the agent's own modules, and the
    core's modules that the bootstrap copies beside it, under either name."""
    top = target.split(".")[0]
    return (top in sys.stdlib_module_names or top == "torch" or target == "stepscope" or any(target == m or target.startswith(m + ".") for m in (*AGENT_MAY_IMPORT, *BOOTSTRAP_NAMES)) or target == AGENT or target.startswith(AGENT + "."))


def violations(edges: dict[str, set[str]]) -> list[str]:
    """One line per import that goes against the layering."""
    found = []
    for source, targets in sorted(edges.items()):
        here = layer(source)
        for target in sorted(targets):
            top = target.split(".")[0]
            if here == "agent" and not agent_may_import(target):
                found.append(f"{source} (agent) imports {target}: the agent's package runs in training pods, with the standard library and {', '.join(AGENT_MAY_IMPORT)} alone")
            elif top in SECOND_NAMES:
                found.append(f"{source} imports {target}: a second name for a folder of the repository")
            elif top == "torch" and here in NO_TORCH:
                found.append(f"{source} ({here}) imports torch")
            elif top == "stepscope" and target != "stepscope":
                there = layer(target)
                if there != here and there not in ALLOWED[here]:
                    found.append(f"{source} ({here}) imports {target} ({there})")
                elif there == "analysis" != here and target not in ANALYSIS_FACE:
                    found.append(f"{source} ({here}) imports {target}: outside the analysis, use stepscope.analysis (the facade) and its model")
                elif there == here == "analysis" and stage(source) in STAGES and stage(target) not in {stage(source), *STAGES[stage(source)]}:
                    found.append(f"{source} (analysis stage {stage(source)}) imports {target} (stage {stage(target)})")
    return found


def test_dependencies_point_one_way() -> None:
    edges = graph()
    assert len(edges) > 80, "the walk found too few modules"
    found = violations(edges)
    assert not found, "imports against the layering (docs/architecture.md):\n" + "\n".join(found)


def test_the_check_sees_back_edges() -> None:
    """The check itself: each kind of back-edge, at the top or inside a function, is reported."""
    planted = {
        "stepscope.storage": {"stepscope.analysis.model"},
        "stepscope.analysis.diagnosis.hardware": {"stepscope.sidecar.nvml.api"},
        "stepscope.sidecar.sessions": {"stepscope.operator.kube"},
        "stepscope.operator.metrics": {"stepscope.sidecar.prometheus"},
        "stepscope.analysis.statistics.summary": {"stepscope.local.launch", "torch"},
        "stepscope.sidecar.uploads": {"sidecar.nvml"},
        "stepscope.sidecar.daemon": {"stepscope.analysis.statistics.summary"},
        "stepscope.analysis.gathering.session_files": {"stepscope.analysis.reporting.merged_trace"},
        "stepscope.analysis.statistics.steps": {"stepscope.analysis"},
        "stepscope.agent.capture": {"stepscope.files", "numpy"},
        "stepscope.operator.sessions.handlers": {"stepscope.agent"},
        "stepscope.local.demo": {"stepscope.testing.nvml.simulated"},
        "stepscope.testing.kube.server": {"tests.polling"},
        "stepscope.analysis.loading.trace": {"stepscope.analysis.statistics.steps"},
    }
    assert len(violations(planted)) == 16
    edges = graph()
    assert "stepscope.operator.sessions.analysis_job" in edges["stepscope.cli"]  # found inside a function
    assert "stepscope.contracts.layout" in edges["stepscope.analysis.reporting.report"]  # `from stepscope.contracts import layout`


def test_parts_live_under_their_import_names() -> None:
    """The code of each part is where its import name says, so a tool that reads imports as text
    finds it; the top-level folder of the same name is only a link to it."""
    for part in PARTS:
        home = REPO / "stepscope" / part
        assert home.is_dir() and not home.is_symlink(), f"stepscope/{part} must hold the code"
        link = REPO / part
        assert link.is_symlink() and link.resolve() == home, f"{part}/ must link to stepscope/{part}"


# Where the environment is read: each part's settings module, and the agent's own reader (the agent
# runs in training processes and imports nothing of the parts).
ENVIRONMENT_READERS = ("settings.py", "stepscope/agent/environment.py")


def environment_reads(path: Path) -> list[str]:
    """Each place `path` reads a variable of the environment (`os.environ.get`, `os.environ[...]`,
    `in os.environ`, `os.getenv`, the whole mapping picked by a condition), as "line: code".
    Writes (`os.environ[k] = v`, `setdefault`) and the whole environment handed on as an argument
    (`dict(os.environ)`, `{**os.environ}`: what a child process starts with) are not reads."""
    tree = ast.parse(path.read_text(), str(path))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def is_environ(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name) and node.value.id == "os"

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "getenv" and isinstance(node.value, ast.Name) and node.value.id == "os":
            found.append(node)
        elif is_environ(node):
            parent = parents[node]
            written = (isinstance(parent, ast.Subscript) and isinstance(parent.ctx, ast.Store | ast.Del)) or (
                isinstance(parent, ast.Attribute) and parent.attr in ("setdefault", "update", "pop"))
            handed_on = (isinstance(parent, ast.Call) and node in parent.args) or (isinstance(parent, ast.Dict) and None in parent.keys)
            if not (written or handed_on):
                found.append(node)
    return [f"{node.lineno}: {ast.get_source_segment(path.read_text(), parents[node]) or ''}" for node in sorted(found, key=lambda n: (n.lineno, n.col_offset))]


def test_only_settings_modules_read_the_environment() -> None:
    found = [f"{path.relative_to(REPO)}:{read}" for path in sorted((REPO / "stepscope").rglob("*.py"))
             if not (path.name == ENVIRONMENT_READERS[0] or str(path.relative_to(REPO)) in ENVIRONMENT_READERS[1:]
                     or path.is_relative_to(REPO / "stepscope" / "testing"))
             for read in environment_reads(path)]
    assert not found, "the environment read outside a settings module:\n" + "\n".join(found)


def test_the_check_sees_environment_reads(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("import os\n"
                       "a = os.environ.get('A')\nb = os.environ['B']\nc = 'C' in os.environ\nd = os.getenv('D')\n"
                       "e = os.environ if a else {}\n"
                       "os.environ['F'] = '1'\nos.environ.setdefault('G', '1')\nchild = dict(os.environ)\nalso = {**os.environ, 'H': '1'}\n")
    assert [line.split(":")[0] for line in environment_reads(planted)] == ["2", "3", "4", "5", "6"]


def test_the_benchmarks_import_no_tests() -> None:
    """The benchmarks share the tests' doubles through stepscope.testing, never through tests.*."""
    found = [f"{path.name} imports {target}" for path in sorted((REPO / "benchmarks").glob("*.py"))
             for target in sorted(imports(path, f"benchmarks.{path.stem}")) if target.split(".")[0] == "tests"]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("name", ["tests", "helm", "benchmarks"])
def test_nothing_outside_the_package_imports_through_it(name: str) -> None:
    with pytest.raises(ModuleNotFoundError):
        __import__(f"stepscope.{name}")


def test_python_started_in_the_repository_keeps_the_standard_library() -> None:
    code = "import operator, stepscope.operator.settings; print(operator.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.strip() == stdlib_operator.__file__


def test_the_linter_reads_every_part() -> None:
    """`make lint` checks the parts' code at its real path (the linter does not follow the top-level
    links, so an exclude for them would drop stepscope/<part>/ and tests/<part>/ as well)."""
    ruff = Path(sys.executable).with_name("ruff")
    if not ruff.exists():
        pytest.skip("ruff is not installed (the lint extra)")
    listed = subprocess.run([str(ruff), "check", "--show-files"], cwd=REPO, capture_output=True, text=True, timeout=120, check=True).stdout
    checked = {Path(line.strip()).relative_to(REPO).parts[:2] for line in listed.splitlines() if line.strip().startswith(str(REPO))}
    for part in PARTS:
        assert ("stepscope", part) in checked, f"ruff skips stepscope/{part}/"
        assert (part,) not in {p[:1] for p in checked}, f"ruff reads {part}/ twice, through its link"
    assert ("tests", "analysis") in checked, "ruff skips tests/analysis/"


def outside_the_standard_library(edges: dict[str, set[str]]) -> list[str]:
    """The contracts' imports of anything but the standard library and the contracts."""
    return [f"{module} imports {target}" for module, targets in sorted(edges.items()) if module.startswith("stepscope.contracts")
            for target in sorted(targets) if target.split(".")[0] not in sys.stdlib_module_names and not target.startswith("stepscope.contracts")]


def test_the_contracts_import_the_standard_library_alone() -> None:
    """stepscope.contracts is what the agent reads in every training process and what the CRDs are
    generated from: it imports nothing but the standard library and itself."""
    edges = graph()
    assert "stepscope.contracts.session" in edges
    found = outside_the_standard_library(edges)
    assert not found, "\n".join(found)
    planted = {"stepscope.contracts.session": {"yaml", "enum", "stepscope.contracts.schema"}, "stepscope.contracts.states": {"stepscope.wire"}}
    assert outside_the_standard_library(planted) == ["stepscope.contracts.session imports yaml", "stepscope.contracts.states imports stepscope.wire"]
