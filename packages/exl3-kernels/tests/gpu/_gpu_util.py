"""Helpers of the GPU tests (imported by the test modules; conftest puts this folder on sys.path)."""
from __future__ import annotations

import torch

from exl3_kernels import _ops


def compiled(codebook: int, k2: int) -> bool:
    return k2 in _ops.compiled_k2() and any(cb == codebook for cb, _ in _ops.built_instances())


def random_layer(k: int, ns: list[int], k2s: list[int], seed: int = 0, device: str = "cuda", bias: bool = False):
    """Random (valid) trellises + realistic suh/svh: y has rms ~ 1 for x ~ N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    trellis, suh, svh = [], [], []
    for n, k2 in zip(ns, k2s):
        t = torch.randint(-32768, 32768, (k // 16, n // 16, 8 * k2), generator=g, dtype=torch.int32).to(torch.int16)
        sign_u = torch.randint(0, 2, (k,), generator=g) * 2 - 1
        sign_v = torch.randint(0, 2, (n,), generator=g) * 2 - 1
        su = sign_u * (0.5 + torch.rand(k, generator=g)) / (1.2437 * k ** 0.5)
        sv = sign_v * (0.5 + torch.rand(n, generator=g))
        trellis.append(t.to(device))
        suh.append(su.half().to(device))
        svh.append(sv.half().to(device))
    b = (torch.randn(sum(ns), generator=g) * 0.1).float().to(device) if bias else None
    return trellis, suh, svh, b


def reference_forward(x, trellis, suh, svh, bias, codebook: str, out_dtype=torch.float32):
    """Concatenated per-shard reference (fp16 activations, fp64 matmul on CUDA, fp32 epilogue)."""
    from exl3_kernels import reference

    ys = [reference.linear_forward(x, t, su, sv, codebook, out_dtype=torch.float32) for t, su, sv in zip(trellis, suh, svh)]
    y = torch.cat(ys, dim=-1)
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def capture_graph(fn):
    """Warm fn up on a side stream (workspaces, autotuner), then capture one call of it into a CUDA graph.

    Returns (graph, output tensor of the captured call); replaying the graph rewrites that tensor in place."""
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        out = fn()
    return g, out


def assert_shards_match(y, x, trellis, suh, svh, bias, cb: str, tol: float, ctx=()) -> None:
    """Each shard's columns of a fused layer's output y [m, n_total] against that shard's own single-shard reference
    (reference_forward), relative error below tol; ctx is added to the assertion message."""
    off = 0
    for t, su, sv in zip(trellis, suh, svh):
        n = t.shape[1] * 16
        r = reference_forward(x, [t], [su], [sv], None if bias is None else bias[off:off + n], cb)
        assert rel_err(y[:, off:off + n], r) < tol, (*ctx, off, rel_err(y[:, off:off + n], r))
        off += n
