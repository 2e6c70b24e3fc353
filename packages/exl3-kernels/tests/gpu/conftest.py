"""GPU test fixtures: skip cleanly without CUDA or without the compiled op library."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

import exl3_kernels
from exl3_kernels import _ops

ORACLE = Path(os.environ.get("EXL3_ORACLE_DIR") or Path(__file__).resolve().parents[4] / ".." / "shared" / "oracle")


sys.path.insert(0, str(Path(__file__).resolve().parent))


def pytest_collection_modifyitems(config, items):
    why = None
    if not torch.cuda.is_available():
        why = "needs a CUDA device"
    elif not _ops.available():
        why = f"compiled exl3_kernels library not loadable: {_ops.load_error()}"
    here = Path(__file__).resolve().parent
    for item in items:
        # this hook sees every item of the session: mark only the tests below this folder
        if Path(str(item.path)).resolve().is_relative_to(here):
            item.add_marker(pytest.mark.gpu)
            if why:
                item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture(scope="session")
def oracle_dir() -> Path:
    """The exllamav3 oracle folder (EXL3_ORACLE_DIR or ../shared/oracle); skip, or fail under EXL3_REQUIRE_ORACLE=1."""
    if not ORACLE.is_dir():
        if os.environ.get("EXL3_REQUIRE_ORACLE") == "1":
            pytest.fail(f"oracle vectors not found at {ORACLE} and EXL3_REQUIRE_ORACLE=1")
        pytest.skip(f"oracle vectors not found at {ORACLE}")
    return ORACLE
