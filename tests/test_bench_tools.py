"""CPU tests of the benchmark helpers in bench/ (they only run on the GPU machine otherwise)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_gemm  # noqa: E402


def test_bucket_key_picks_m_own_bucket_not_the_first_primed():
    # the order the autotuner fills its cache on the first call at m = 256: primed buckets 128, 64, ... first; keys
    # built by the autotuner's own key function, so a change of its layout shows up here
    import torch

    from exl3_kernels import autotune
    from exl3_kernels.plan import LayerShape

    shape = LayerShape(k=4096, ns=(11008,), k2s=(8,), codebook=1)
    plans = {autotune._key(shape, b, torch.bfloat16, torch.device("cuda", 0), False): f"plan{b}"
             for b in (128, 64, 32, 16, 8, 4, 2, 1, 256)}
    assert bench_gemm.bucket_key(plans, 256)[1] == 256
    assert bench_gemm.bucket_key(plans, 200)[1] == 256  # m = 200 is in the 256 bucket
    assert bench_gemm.bucket_key(plans, 1)[1] == 1
    with pytest.raises(KeyError, match="m bucket 512"):
        bench_gemm.bucket_key(plans, 300)
