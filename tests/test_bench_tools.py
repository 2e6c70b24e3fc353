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


def test_report_ab_rows_and_ratio(tmp_path):
    """bench/report_ab.py: one row per (shape, K, m) of the runs, each run's time and plan, cuBLAS of the first run,
    and last / first."""
    import json
    import subprocess

    def run(us, plan="gemm(bm=16,split=6)"):
        return {"gpu": "H200", "torch": "2.11.0", "codebook": "mcg",
                "points": [{"shape": "4096x11008", "K": 4.0, "m": 1, "plan": plan, "ours_us": us,
                            "cublas_us": 25.0}]}
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(run(20.0)))
    b.write_text(json.dumps(run(19.0, "wgmma(split=3)")))
    out = tmp_path / "ab.md"
    subprocess.run([sys.executable, str(Path(__file__).resolve().parents[1] / "bench" / "report_ab.py"), str(out),
                    f"main={a}", f"new={b}", "--title", "t"], check=True, capture_output=True)
    row = [line for line in out.read_text().splitlines() if line.startswith("| 4096x11008")]
    assert row == ["| 4096x11008 | 4 | 1 | 20.0 (bm=16,split=6) | 19.0 (wgmma(split=3)) | 25.0 | 0.950 |"]
    assert set(json.loads(out.with_suffix(".json").read_text())) == {"main", "new"}


def test_replay_gap_pins_each_plan(monkeypatch):
    """bench/replay_gap.py pins a plan string as Plan.__str__ writes it, and the autotuner's pins read it back."""
    import os

    import replay_gap

    from exl3_kernels import autotune
    from exl3_kernels.plan import Plan

    for v in replay_gap.PIN_VARS:
        monkeypatch.delenv(v, raising=False)
    for plan in (Plan("gemm", 128, 5), Plan("gemm", 16, 6, lohi=True), Plan("reconstruct_n")):
        replay_gap.pin(str(plan), pdl=False)
        assert os.environ["CUDA_EXL3_PDL"] == "0"
        assert autotune._apply_pins(Plan("reconstruct"), (16,)) == plan
    for v in replay_gap.PIN_VARS:  # pin() wrote os.environ directly
        os.environ.pop(v, None)


def test_overhead_sweep_fit_recovers_a_line():
    """overhead_sweep.fit is ordinary least squares: an exact line comes back exactly, a noisy one to its mean."""
    import overhead_sweep

    a, b = overhead_sweep.fit([256, 512, 1024, 2048, 4096], [5.8 + 3.67 * k / 1024 for k in (256, 512, 1024, 2048, 4096)])
    assert a == pytest.approx(5.8) and b * 1024 == pytest.approx(3.67)
    a, b = overhead_sweep.fit([0, 0, 2, 2], [1.0, 3.0, 5.0, 7.0])  # means 2 at x = 0 and 6 at x = 2
    assert (a, b) == pytest.approx((2.0, 2.0))
