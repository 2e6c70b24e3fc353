"""The package skeleton installs, imports without any EXL3 package, and declares no ops yet."""
import tomllib
from pathlib import Path

import mla_sparse


def test_version_matches_pyproject():
    meta = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert mla_sparse.__version__ == meta["project"]["version"]


def test_independent_of_exl3_packages():
    meta = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert not any(d.startswith("exl3") for d in meta["project"]["dependencies"])
    assert mla_sparse.OPS == ()
