"""CUDA_EXL3_* variables, the deprecated VLLM_EXL3_* spelling, and their errors."""
from __future__ import annotations

import warnings

import pytest

from exl3_kernels import env


def test_new_spelling_wins_and_old_warns(monkeypatch):
    monkeypatch.setattr(env, "_warned", set())
    monkeypatch.setenv("VLLM_EXL3_BM", "32")
    with pytest.warns(FutureWarning, match="VLLM_EXL3_BM is deprecated; use CUDA_EXL3_BM"):
        assert env.get_int("BM") == 32
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once per name, not on every call
        assert env.get_int("BM") == 32
    monkeypatch.setenv("CUDA_EXL3_BM", "64")
    assert env.get_int("BM") == 64


def test_defaults_and_booleans(monkeypatch):
    for v in ("CUDA_EXL3_AUTOTUNE", "VLLM_EXL3_AUTOTUNE"):
        monkeypatch.delenv(v, raising=False)
    assert env.get_bool("AUTOTUNE", True) is True
    monkeypatch.setenv("CUDA_EXL3_AUTOTUNE", "0")
    assert env.get_bool("AUTOTUNE", True) is False
    monkeypatch.setenv("CUDA_EXL3_AUTOTUNE", "yes")
    assert env.get_bool("AUTOTUNE") is True


def test_errors_name_the_spelling_read(monkeypatch):
    monkeypatch.setattr(env, "_warned", set())
    monkeypatch.delenv("CUDA_EXL3_SPLIT", raising=False)
    monkeypatch.setenv("VLLM_EXL3_SPLIT", "four")
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match="VLLM_EXL3_SPLIT must be an integer, got 'four'"):
        env.get_int("SPLIT")
    monkeypatch.setenv("CUDA_EXL3_DETERMINISTIC", "maybe")
    with pytest.raises(ValueError, match="CUDA_EXL3_DETERMINISTIC must be a boolean"):
        env.get_bool("DETERMINISTIC")
