"""Fixtures for the exl3-vllm CPU tests. vLLM's CPU platform is forced here, before any other vLLM import (the
binding is process-wide: GPU tests of this package need their own pytest process)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from exl3_vllm_testutil import force_cpu_platform  # noqa: E402

force_cpu_platform()

from exl3_vllm_testutil import init_distributed, write_checkpoint  # noqa: E402

#: Mixed K inside q/k/v (and a half rate, which needs mul1) so the fused layers hold trellises of different shapes.
MIXED_K = {"*.k_proj": 3, "*.v_proj": 5}


@pytest.fixture(scope="session", autouse=True)
def vllm_plugins():
    """Run the vLLM plugin entry points (ours registers the ``exl3`` quant config)."""
    from vllm.plugins import load_general_plugins

    load_general_plugins()


@pytest.fixture(scope="session")
def dist():
    """gloo parallel state at TP=1, once per session."""
    init_distributed(1, 0)


@pytest.fixture(scope="session")
def ckpt_dir(tmp_path_factory):
    """Factory of session-cached synthetic EXL3 checkpoints: ``ckpt_dir(name, preset, config=..., **writer_args)``."""
    root = tmp_path_factory.mktemp("exl3-ckpts")
    cache: dict[str, Path] = {}

    def make(name: str, preset: str, **kwargs) -> Path:
        if name not in cache:
            cache[name] = write_checkpoint(root / name, preset, seed=len(cache) + 1, **kwargs)
        return cache[name]

    return make


@pytest.fixture(scope="session")
def llama_ckpt(ckpt_dir):
    """Llama: MLP 688 and vocab 1000 padded to 768/1024 on disk; q/k/v at K=4/3/5 (mcg)."""
    return ckpt_dir("llama", "tiny_llama", overrides=MIXED_K, codebook="mcg")


@pytest.fixture(scope="session")
def qwen2_ckpt(ckpt_dir):
    """Qwen2: q/k/v biases; mul1 with K=2.5 for k_proj, 4 for v_proj; lm_head K=5."""
    return ckpt_dir("qwen2", "tiny_qwen2", overrides={"*.k_proj": 2.5, "*.v_proj": 4}, codebook="mul1",
                    default_bits=3, head_bits=5)


@pytest.fixture(scope="session")
def qwen3_ckpt(ckpt_dir):
    """Qwen3 (q_norm/k_norm), 3inst codebook, K=2 MLP."""
    return ckpt_dir("qwen3", "tiny_qwen3", overrides={"*.mlp.*": 2, "*.q_proj": 6}, codebook="3inst")


@pytest.fixture(scope="session")
def llama_bias_ckpt(ckpt_dir):
    """Llama with ``attention_bias``: q/k/v and the row-parallel o_proj carry biases; mul1, K=2.5 for o_proj."""
    return ckpt_dir("llama-bias", "tiny_llama", config={"attention_bias": True}, codebook="mul1",
                    overrides={"*.o_proj": 2.5})
