"""Shared fixtures for the exl3-kernels tests: oracle vectors and device selection."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# EXL3_ORACLE_DIR, else <repo>/../shared/oracle (<repo>/packages/exl3-kernels/tests/conftest.py)
ORACLE_DIR = Path(os.environ.get("EXL3_ORACLE_DIR") or Path(__file__).resolve().parents[3].parent / "shared" / "oracle")
# CI sets EXL3_REQUIRE_ORACLE=1: there the oracle must be present, and its absence fails instead of skipping.
REQUIRE_ORACLE = os.environ.get("EXL3_REQUIRE_ORACLE") == "1"


def oracle_path(name: str) -> Path:
    """Path of one oracle file; skips the calling test cleanly when the oracle set is absent (fails under
    EXL3_REQUIRE_ORACLE=1)."""
    path = ORACLE_DIR / name
    if not path.is_file():
        if REQUIRE_ORACLE:
            pytest.fail(f"oracle file {path} not present and EXL3_REQUIRE_ORACLE=1")
        pytest.skip(f"oracle file {path} not present")
    return path


_CACHE: dict[str, dict] = {}


def load_oracle(name: str) -> dict:
    """All tensors of one oracle safetensors file (cached for the session; CPU tensors)."""
    if name not in _CACHE:
        from safetensors.torch import load_file

        _CACHE[name] = load_file(str(oracle_path(name)))
    return _CACHE[name]


@pytest.fixture
def cuda_device():
    """A CUDA device, or skip (GPU tests are marked ``gpu`` and skip cleanly without one)."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return torch.device("cuda")


@pytest.fixture
def oracle():
    """Callable ``oracle(name) -> dict[str, Tensor]`` loading ``../shared/oracle/<name>`` (skips when absent)."""
    return load_oracle
