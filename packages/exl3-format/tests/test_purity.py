"""The package stays pure Python: no torch anywhere, no runtime dependencies beyond the stdlib."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]


def test_no_torch_import_in_sources():
    sources = sorted((PACKAGE / "src" / "exl3_format").glob("*.py"))
    assert len(sources) >= 10
    for path in sources:
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] not in ("torch", "numpy", "safetensors"), f"{path.name} imports {name}"


def test_no_runtime_dependencies():
    project = tomllib.loads((PACKAGE / "pyproject.toml").read_text())["project"]
    assert project["dependencies"] == []
    assert project["scripts"] == {"exl3-inspect": "exl3_format.cli:main"}
