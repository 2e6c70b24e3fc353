"""The wgmma prototype's barrier protocol under random schedules (bench/wgmma_protocol_model.py), CPU only.

The decoding-consumer variants of bench/wgmma_gemm_proto.cu (cdec-tma, cdec-l2-tma, cdec-half-tma) were written in a
session without a GPU; this is the check they had before any GPU run: the four ways of writing B stages run without a
deadlock or a slot hazard, and the model does catch the two mistakes the kernel's comments say it avoids (a decode
distance past kStages - 2 deadlocks; at distance 2 the decoding consumers' empty wait is what keeps them from
overwriting a slot the other warpgroup's wgmma still reads). At distance 1 the wait is implied by the full barrier
(the other warpgroup's decode of stage s follows its wait_group that retired stage s - 3), which the last test records.

The schedules are biased per run (model docstring); with that bias the mutants below fail in 14-43% of the runs each
(review of the thirty-fifth session: with a uniform choice of moves the L = 2 mutant failed in 2 of 300 at 5 stages),
so 300 runs miss a mutant with probability < 1e-19, and the clean runs are evidence of the same strength.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("wgmma_protocol_model", ROOT / "bench" / "wgmma_protocol_model.py")
model = importlib.util.module_from_spec(_spec)
sys.modules["wgmma_protocol_model"] = model
_spec.loader.exec_module(model)

VARIANTS = {"full-tma": model.FULL_TMA, "cdec-tma": model.CDEC, "cdec-l2-tma": model.CDEC_L2,
            "cdec-half-tma": model.CDEC_HALF}


@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.parametrize("ns", (1, 2, 3, 5, 9))
def test_variants_run_without_violation(name, ns):
    model.check(VARIANTS[name], ns, seeds=300)


@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.parametrize("ns", (5, 9))
def test_early_release_is_caught(name, ns):
    # releasing stage s - 1 after wait_group 2 instead of 1: the producer (or a decoding consumer) rewrites a slot
    # that a pending wgmma group still reads
    with pytest.raises(model.ProtocolError, match="while WG[01]'s wgmma"):
        model.check(dataclasses.replace(VARIANTS[name], wait_group=2), ns, seeds=300)


@pytest.mark.parametrize("ns", (5, 9))
def test_decode_distance_3_deadlocks(ns):
    with pytest.raises(model.ProtocolError, match="deadlock"):
        model.check(dataclasses.replace(model.CDEC, dist=3), ns, seeds=20)


@pytest.mark.parametrize("ns", (5, 9))
def test_distance_2_needs_the_empty_wait(ns):
    with pytest.raises(model.ProtocolError, match=r"writes c[01] of slot \d \(stage \d+\) while WG[01]'s wgmma"):
        model.check(dataclasses.replace(model.CDEC_L2, consumer_empty_wait=False), ns, seeds=300)


def test_distance_1_empty_wait_is_implied():
    for v in (model.CDEC, model.CDEC_HALF):
        for ns in (5, 9):
            model.check(dataclasses.replace(v, consumer_empty_wait=False), ns, seeds=500)


def test_model_constants_match_the_prototype():
    src = (ROOT / "bench" / "wgmma_gemm_proto.cu").read_text()
    assert int(re.search(r"constexpr int kStages = (\d+);", src).group(1)) == model.STAGES
    assert int(re.search(r"constexpr int kAhead = (\d+);", src).group(1)) == model.AHEAD
    assert "L >= 1 && L <= kStages - 2" in src
    # the distances and tile counts the model's variants stand for
    assert re.search(r"v_cdist\(int v\) \{ return v == kCdecL2Tma \? 2 : 1; \}", src)
    assert re.search(r"\(v == kCdecTma \|\| v == kCdecL2Tma\) \? 4 : \(v == kCdecHalfTma \? 2 : 0\)", src)
