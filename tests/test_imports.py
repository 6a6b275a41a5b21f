"""The package's modules form a chain: each imports only modules before it,
at any depth (function-level imports included), so that the library never
reaches into the experiment runner."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "annotated_s4"

# The reading order: the math, the layers, models and training, the modules
# beside them, the experiment side, the command line.
CHAIN = ["_checks", "_types", "precision", "ssm", "hippo", "s4", "probe", "toeplitz", "selective", "ssd",
         "decoders", "catalog", "layers", "h3", "attention",
         "gru", "longconv", "mamba", "mamba2", "models", "train", "sample", "checkpoint", "data", "tasks", "datasets", "timing",
         "plotting", "config", "registry", "runs", "measure", "completion", "runner", "reference",
         "evidence", "cli", "__main__"]
# The package's namespace re-exports the library, never the runner.
LIBRARY_END = "models"


def imported(path):
    """The package's modules that the file at `path` imports, anywhere in it."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0 and not (node.module or "").startswith("annotated_s4"):
                continue
            module = (node.module or "").removeprefix("annotated_s4").lstrip(".")
            if module:
                names.add(module.split(".")[0])
            else:  # from . import x, y
                names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name.split(".")[1] for alias in node.names
                         if alias.name.startswith("annotated_s4."))
    return names


def test_the_chain_lists_every_module():
    modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert modules == set(CHAIN)


@pytest.mark.parametrize("module", CHAIN)
def test_a_module_imports_only_earlier_ones(module):
    later = set(CHAIN[CHAIN.index(module):])
    assert not imported(PACKAGE / f"{module}.py") & later, \
        f"{module} imports {sorted(imported(PACKAGE / f'{module}.py') & later)}"


def test_the_package_namespace_is_the_library():
    later = set(CHAIN[CHAIN.index(LIBRARY_END) + 1:])
    assert not imported(PACKAGE / "__init__.py") & later


def test_the_check_sees_function_level_imports(tmp_path):
    """A lazy import inside a function counts (what a cycle hides behind)."""
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from .cli import main\n    from . import reference\n"
                      "    import annotated_s4.runner\n")
    assert imported(source) == {"cli", "reference", "runner"}
