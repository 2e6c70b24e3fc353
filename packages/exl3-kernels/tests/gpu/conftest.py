"""GPU test fixtures: skip cleanly without CUDA or without the compiled op library."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

import exl3_kernels
from exl3_kernels import _ops

ORACLE = Path(os.environ.get("EXL3_ORACLE_DIR", Path(__file__).resolve().parents[4] / ".." / "shared" / "oracle"))


sys.path.insert(0, str(Path(__file__).resolve().parent))


def pytest_collection_modifyitems(config, items):
    why = None
    if not torch.cuda.is_available():
        why = "needs a CUDA device"
    elif not _ops.available():
        why = f"compiled exl3_kernels library not loadable: {_ops.load_error()}"
    for item in items:
        if "gpu" in str(item.fspath):
            item.add_marker(pytest.mark.gpu)
            if why:
                item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture(scope="session")
def oracle_dir() -> Path:
    if not ORACLE.is_dir():
        pytest.skip(f"oracle vectors not found at {ORACLE}")
    return ORACLE
