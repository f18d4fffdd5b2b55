"""The house's layers: public API -> validation -> dispatch -> launchers -> kernels, and
references beside them. No module imports one from a layer above it, kernel files hold jit
code only, and references share no code with the kernels."""

import ast
import pathlib

import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "vflash"

# package -> vflash modules it must not import (a layer above it, or the kernels for references)
FORBIDDEN = {
    "kernels": ("vflash.ops", "vflash.dispatch", "vflash.api", "vflash.harness", "vflash.cli", "vflash.reference",
                "vflash._validate", "vflash._backend", "vflash.call", "vflash.pipeline", "vflash.library"),
    "ops": ("vflash.dispatch", "vflash.api", "vflash.harness", "vflash.cli", "vflash._validate", "vflash.pipeline",
            "vflash.library"),
    "dispatch": ("vflash.api", "vflash.harness", "vflash.cli", "vflash._validate", "vflash.pipeline",
                 "vflash.library"),
    "reference": ("vflash.kernels", "vflash.ops", "vflash.dispatch", "vflash.api", "vflash._backend"),
}


def test_a_call_is_described_on_the_ground_floor():
    # vflash/call.py, the value every layer reads, imports no other vflash module
    assert not [name for name in _imports(SRC / "call.py") if name.startswith("vflash")]


def _imports(path: pathlib.Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_import_runs_back_up_a_layer(package):
    files = sorted((SRC / package).glob("*.py"))
    assert files
    for path in files:
        for name in _imports(path):
            assert not name.startswith(FORBIDDEN[package]), f"{path.relative_to(SRC)} imports {name}"


def test_kernel_files_hold_jit_code_only():
    # Top level: docstring, imports, jit functions, constexpr constants and the Gluon import
    # guard; no tables (dicts, NamedTuples, dataclasses) and no host-side functions.
    for path in sorted((SRC / "kernels").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            where = f"{path.name}:{node.lineno}"
            if isinstance(node, ast.FunctionDef):
                decorators = [ast.unparse(d) for d in node.decorator_list]
                assert any(d.endswith("jit") for d in decorators), f"{where}: {node.name} is not a jit function"
            elif isinstance(node, ast.Assign):
                assert not isinstance(node.value, (ast.Dict, ast.DictComp)), f"{where}: a table in a kernel file"
            else:
                assert isinstance(node, (ast.Expr, ast.Import, ast.ImportFrom, ast.Try, ast.If)), \
                    f"{where}: {type(node).__name__} at a kernel file's top level"
