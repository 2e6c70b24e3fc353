"""Shared fixtures for the exl3-kernels tests: oracle vectors and device selection."""

from __future__ import annotations

from pathlib import Path

import pytest

# <repo>/packages/exl3-kernels/tests/conftest.py -> <repo>/../shared/oracle
ORACLE_DIR = Path(__file__).resolve().parents[3].parent / "shared" / "oracle"


def oracle_path(name: str) -> Path:
    """Path of one oracle file; skips the calling test cleanly when the oracle set is absent."""
    path = ORACLE_DIR / name
    if not path.is_file():
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
