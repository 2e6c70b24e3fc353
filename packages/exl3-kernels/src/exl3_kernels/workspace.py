"""Process-wide workspaces of the EXL3 linear, one set per CUDA device.

- ``splitk_acc(device)``: the fp32 split-k accumulator. Contract: all zero between ops; the GEMM adds
  into it and its epilogue re-zeroes what it touched, so no per-call memset exists. Sized by
  CUDA_EXL3_SPLITK_WORKSPACE_MB (the planner refuses split-k through it for m * n beyond it; split-k in a thread
  block cluster does not use it).
- ``sk_slots(device, blocks)``: the stream-k wgmma GEMM's hand-over buffer (1024 int32 flags, then one 128 KB slot of
  running sums per block; plan.sk_acc_elems). Contract: the flags are zero between ops (the kernel resets them); the
  slots may hold anything (every slot is written before it is read in a call), which is why this is not the split-k
  accumulator, whose contract is all zero.
- ``splitk_flags(device)``: int32 counters, one per output tile, for split-k finished inside the GEMM by the last split
  block of each tile (csrc/include/exl3/splitk_finish.cuh). Contract: all zero between ops (the finishing block resets
  its tile's counter). SPLITK_FLAGS entries (256 KB), created together with the accumulator; a call with more tiles
  than that runs the split-k epilogue kernel instead (linear.py).
- ``recon(device, numel, dtype)``: the dense-W buffer of the reconstruct path (grow-only, capped by
  CUDA_EXL3_RECON_WORKSPACE_MB; larger layers are processed in column chunks).

All of them must be created before CUDA-graph capture (vLLM's profile run does that: it runs the largest batch
eagerly first, and the autotuner times every candidate, stream-k included, eagerly). Growing one during capture
raises, because an allocation inside capture would belong to the graph's private pool; a reconstruct or stream-k
buffer outgrown later (e.g. by an lm_head computed eagerly) is kept alive, never freed, because graphs captured
earlier still write to it. Assumption: one compute stream per
device uses them (vLLM's model runner).
"""
from __future__ import annotations

import torch

from . import env

_acc: dict[int, torch.Tensor] = {}
_flags: dict[int, torch.Tensor] = {}
# Tile counters of splitk_flags: ceil(m / BM) x n / 128 per call; 65536 covers e.g. a 128256-column lm_head (1002 column
# blocks) at BM 8 up to m = 520, and every split-k plan of the benchmark shapes (at most a few thousand tiles).
SPLITK_FLAGS = 65536
_sk: dict[int, torch.Tensor] = {}
_recon: dict[int, torch.Tensor] = {}
# Buffers replaced by a bigger one stay referenced for the life of the process: a CUDA graph captured while
# an older buffer was current keeps writing to its address on every replay, so that memory must never
# return to the allocator. Growth is rare (the largest layer is usually seen in vLLM's profile run).
_retired: list[torch.Tensor] = []


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def splitk_capacity() -> int:
    """Accumulator capacity in fp32 elements."""
    return env.get_int("SPLITK_WORKSPACE_MB", 64) * (1 << 20) // 4


def splitk_acc(device: torch.device) -> torch.Tensor:
    """The zeroed fp32 split-k accumulator of ``device`` (allocated on first use)."""
    i = _index(device)
    t = _acc.get(i)
    if t is None:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("exl3_kernels: the split-k workspace must be created before CUDA-graph capture "
                               "(run one eager forward first)")
        t = torch.zeros(splitk_capacity(), dtype=torch.float32, device=torch.device("cuda", i))
        _acc[i] = t
        splitk_flags(t.device)  # with it: every plan that reaches the accumulator eagerly also has the counters before
        # capture (pinned plans and CUDA_EXL3_AUTOTUNE=0 skip the small buckets that would otherwise create them first)
    return t


def splitk_flags(device: torch.device) -> torch.Tensor:
    """The zeroed int32 [SPLITK_FLAGS] tile counters of ``device`` (allocated on first use; like the accumulator, before
    CUDA-graph capture, RuntimeError otherwise)."""
    i = _index(device)
    t = _flags.get(i)
    if t is None:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("exl3_kernels: the split-k tile counters must be created before CUDA-graph capture "
                               "(run one eager forward first)")
        t = torch.zeros(SPLITK_FLAGS, dtype=torch.int32, device=torch.device("cuda", i))
        _flags[i] = t
    return t


def sk_slots(device: torch.device, blocks: int) -> torch.Tensor:
    """The stream-k buffer of ``device`` for ``blocks`` blocks (zeros when allocated; grow-only, and like the other
    workspaces it must be created before CUDA-graph capture, RuntimeError otherwise)."""
    from .plan import sk_acc_elems

    i = _index(device)
    need = sk_acc_elems(blocks)
    t = _sk.get(i)
    if t is None or t.numel() < need:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("exl3_kernels: the stream-k workspace must be created before CUDA-graph capture "
                               "(run one eager forward first)")
        if t is not None:
            _retired.append(t)
        t = torch.zeros(need, dtype=torch.float32, device=torch.device("cuda", i))
        _sk[i] = t
    return t


def recon_capacity_bytes() -> int:
    """Cap of the dense-W workspace in bytes (CUDA_EXL3_RECON_WORKSPACE_MB, default 512 MiB); layers whose W is
    larger are reconstructed and multiplied in column chunks of at most this size."""
    return env.get_int("RECON_WORKSPACE_MB", 512) * (1 << 20)


def recon(device: torch.device, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A flat buffer of at least ``numel`` elements of ``dtype`` (2 bytes) for dense W."""
    i = _index(device)
    need = numel * 2
    t = _recon.get(i)
    if t is None or t.numel() < need:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"exl3_kernels: the reconstruct workspace must grow to {need} bytes, which cannot "
                               "happen during CUDA-graph capture (run the largest batch eagerly first)")
        if t is not None:
            _retired.append(t)
        t = torch.empty(need, dtype=torch.uint8, device=torch.device("cuda", i))
        _recon[i] = t
    return t[:need].view(dtype)


def reset() -> None:
    """Drop all workspaces (tests only: never while a captured CUDA graph may replay)."""
    _acc.clear()
    _flags.clear()
    _sk.clear()
    _recon.clear()
    _retired.clear()
