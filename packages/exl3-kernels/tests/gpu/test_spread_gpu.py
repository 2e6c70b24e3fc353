"""Grids below one full wave spread evenly (csrc/include/exl3/spread.h, CUDA_EXL3_SPREAD, on by default).

The launch asks for more dynamic shared memory than the kernel needs, so that no SM can hold more than ceil(blocks /
SMs) of the grid's blocks. Checked here: the size the rule picks on this device (the two inequalities that define it,
and that it leaves full waves, the knob's off spellings and tiny needs alone), and that GEMM outputs do not depend on
it (bit for bit without split-k, within the fp32 atomics' order with it) for the mma.sync and register-A GEMMs.
Skipped without CUDA (conftest).
"""
from __future__ import annotations

import json

import pytest
import torch

from exl3_kernels import _ops, workspace

from _gpu_util import compiled, random_layer, reference_forward, rel_err
from test_gemm_gpu import CBS, TOL, _acc_is_zero

RESERVED = 1024  # shared memory the driver reserves per block on sm_80 and later (cudaDevAttrReservedSharedMemoryPerBlock;
# CUDA C++ Programming Guide, "Shared Memory" of the compute capability 8.x / 9.0 sections)


def _need_rule():
    if _ops.spread_smem(0, 1, 1) is None:
        pytest.skip("a library built before the spread rule")


def test_spread_smem_sizes(monkeypatch):
    _need_rule()
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    sms, per_sm = props.multi_processor_count, props.shared_memory_per_multiprocessor
    monkeypatch.delenv("CUDA_EXL3_SPREAD", raising=False)
    monkeypatch.delenv("VLLM_EXL3_SPREAD", raising=False)
    for per in (1, 2, 3):
        blocks = per * sms - (sms // 2 if per > 1 else sms // 3)  # ceil(blocks / SMs) = per
        s = _ops.spread_smem(20000, blocks, 4)
        assert s > 20000 and s % 128 == 0, (per, s)
        assert per * (s + RESERVED) <= per_sm < (per + 1) * (s + RESERVED), (per, s, per_sm)
        assert s - 128 < per_sm // (per + 1) - RESERVED + 1  # the smallest such multiple of 128
    assert _ops.spread_smem(20000, 4 * sms, 4) == 20000  # a full wave: nothing to spread
    assert _ops.spread_smem(20000, 9 * sms, 4) == 20000  # more than a wave
    assert _ops.spread_smem(150000, sms, 4) == 150000  # already one block per SM at most
    for off in ("0", "false", "OFF", "no", "", " 0", "off\n"):
        monkeypatch.setenv("CUDA_EXL3_SPREAD", off)
        assert _ops.spread_smem(20000, sms, 4) == 20000, repr(off)
    for on in ("1", "true", " yes ", "offf"):
        monkeypatch.setenv("CUDA_EXL3_SPREAD", on)
        assert _ops.spread_smem(20000, sms, 4) > 20000, repr(on)
    with pytest.raises(RuntimeError, match="spread_smem"):
        _ops.spread_smem(-1, sms, 4)


def _cc90() -> bool:
    return tuple(torch.cuda.get_device_capability()) == (9, 0)


@pytest.mark.parametrize("path,bm,split", [("gemm", 16, 1), ("gemm", 16, 8), ("gemm", 64, 4), ("wgmma_rs", 64, 1),
                                           ("wgmma_rs", 16, 4)])
def test_gemm_outputs_do_not_depend_on_spread(path, bm, split, monkeypatch):
    """The grids here are below one wave on any GPU with at least 32 SMs (n = 2048: 16 column blocks x split), so the
    rule changes their launches; the outputs must not change."""
    _need_rule()
    cb = "mcg" if compiled(1, 8) else "mul1"
    if path == "wgmma_rs" and not (_cc90() and _ops.wgmma_rs_usable("cuda", CBS[cb])):
        pytest.skip(f"no register-A wgmma GEMM for {cb} here")
    trellis, suh, svh, bias = random_layer(4096, [2048], [8], seed=61, bias=True)
    m = 16 if bm == 16 else 48
    x = torch.randn(m, 4096, device="cuda", dtype=torch.float16)

    def run():
        xh = _ops.input_transform(x, suh)
        acc = workspace.splitk_acc(x.device)
        if path == "wgmma_rs":
            return _ops.gemm_wgmma_rs(xh, trellis, svh, bias, CBS[cb], bm, split, acc, torch.float16)
        return _ops.gemm(xh, trellis, svh, bias, CBS[cb], bm, split, acc if split > 1 else xh, torch.float16)

    monkeypatch.setenv("CUDA_EXL3_SPREAD", "0")
    ref = run()
    monkeypatch.setenv("CUDA_EXL3_SPREAD", "1")
    got = run()
    exact = split == 1 and path == "gemm"  # the register-A GEMM adds into the accumulator at every split
    if exact:
        assert torch.equal(got, ref)
    else:
        assert rel_err(got, ref) < 1e-3, rel_err(got, ref)
    assert rel_err(got, reference_forward(x, trellis, suh, svh, bias, cb)) < TOL[torch.float16]
    _acc_is_zero()
    monkeypatch.setenv("CUDA_EXL3_SPREAD", "maybe")
    with pytest.raises(ValueError, match="CUDA_EXL3_SPREAD"):
        run()


def _launched_smem(fn, tmp_path, name: str) -> list:
    """The "shared memory" field of the profiler's records of kernels whose name contains ``name``, for one call."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text()).get("traceEvents", [])
    return [e.get("args", {}).get("shared memory") for e in events
            if e.get("cat") == "kernel" and name in e.get("name", "")]


@pytest.mark.parametrize("path,bm,split", [("gemm", 16, 8), ("wgmma_rs", 16, 4)])
def test_the_launch_asks_for_the_spread_size(path, bm, split, monkeypatch, tmp_path):
    """The launch itself carries the rule: the profiler's record of the GEMM kernel shows more shared memory with the
    rule on than off, and so much that two blocks no longer fit on one SM (the grid, 16 column blocks x split, has at
    most one block per SM to place; skipped on GPUs with fewer SMs than its blocks)."""
    _need_rule()
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    if props.multi_processor_count < 16 * split:
        pytest.skip("fewer SMs than the grid's blocks")
    cb = "mcg" if compiled(1, 8) else "mul1"
    if path == "wgmma_rs" and not (_cc90() and _ops.wgmma_rs_usable("cuda", CBS[cb])):
        pytest.skip(f"no register-A wgmma GEMM for {cb} here")
    trellis, suh, svh, _ = random_layer(4096, [2048], [8], seed=62)
    x = torch.randn(16, 4096, device="cuda", dtype=torch.float16)

    def run():
        xh = _ops.input_transform(x, suh)
        acc = workspace.splitk_acc(x.device)
        if path == "wgmma_rs":
            return _ops.gemm_wgmma_rs(xh, trellis, svh, None, CBS[cb], bm, split, acc, torch.float16)
        return _ops.gemm(xh, trellis, svh, None, CBS[cb], bm, split, acc, torch.float16)

    name = "wgmma_rs_kernel" if path == "wgmma_rs" else "gemm_kernel"
    monkeypatch.setenv("CUDA_EXL3_SPREAD", "0")
    off = _launched_smem(run, tmp_path, name)
    monkeypatch.setenv("CUDA_EXL3_SPREAD", "1")
    on = _launched_smem(run, tmp_path, name)
    if not off or not on or off[0] is None or on[0] is None:
        pytest.skip(f"the profiler's kernel records carry no shared memory size here ({off}, {on})")
    if off[0] == on[0] == 0:  # the kernels have no static shared memory: a field of 0 counts the static part only
        pytest.skip("the profiler's shared memory field counts static shared memory only here")
    assert len(off) == len(on) == 1, (off, on)
    assert on[0] > off[0], (off, on)
    assert 2 * (on[0] + RESERVED) > props.shared_memory_per_multiprocessor, (on, props.shared_memory_per_multiprocessor)
    _acc_is_zero()
