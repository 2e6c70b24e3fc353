"""Fixtures for the exl3-format tests; the builders live in ``exl3_format_testutil.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from exl3_format_testutil import CheckpointBuilder, build_qwen3_moe


@pytest.fixture
def builder(tmp_path: Path) -> CheckpointBuilder:
    """An empty synthetic-checkpoint builder writing to ``tmp_path/ckpt``."""
    return CheckpointBuilder(tmp_path / "ckpt")


@pytest.fixture
def qwen3_moe(tmp_path: Path) -> Path:
    """Directory of the Qwen3-MoE-like EXL3 checkpoint (mixed K, MTP, 2 shards, hint with one mismatch)."""
    return build_qwen3_moe(tmp_path / "qwen3-moe-exl3")
