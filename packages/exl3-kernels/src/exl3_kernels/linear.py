"""The EXL3 linear layer as one op: ``exl3_kernels::linear`` and its Python entry :func:`exl3_linear`.

y[..., n_total] = concat_s( had_n( had_k(x * suh_s) @ Ŵ_s ) * svh_s ) + bias, for the shards s of a
(fused) layer side by side in the output (docs/exl3-format.md §4.3).

On CUDA the op picks a plan per (layer shape, m bucket) (:mod:`.autotune`):
- "gemm": input transform (one launch for all shards) + trellis GEMM with fused output transform
  (+ split-k epilogue when split > 1, except at m <= 16, where the GEMM's last split block of each tile finishes);
- "reconstruct": dense W of the whole layer (both Hadamards, suh and svh folded in) into the process-wide
  workspace, then one cuBLAS GEMM;
- "reconstruct_act": dense Ŵ without the transforms (cheaper to build), the input transform before and the
  split-k epilogue (output Hadamard, svh, bias) after one cuBLAS GEMM with fp32 output into the split-k
  workspace (:func:`_run_reconstruct_act`);
- "reconstruct_n": the input transform on the activations (in x's dtype) and the output transform folded into
  the dense weight W_n = Ŵ H_n diag(svh) / sqrt(128), one cuBLAS GEMM straight into y (:func:`_run_reconstruct_n`);
- "wgmma": as "gemm" with the Hopper wgmma kernel (BM 256; compute capability 9.0 only, autotuned from m = 128);
- "wgmma_rs": input transform, the register-A Hopper GEMM (BM 8-128, the decoded trellis as the wgmma A operand;
  compute capability 9.0 only, autotuned up to m = 256), split-k epilogue at every split (at m <= 16 the kernel
  finishes y itself; its cluster plans, m = 32-256, reduce split-k inside a thread block cluster and write y).
On CPU (and any device without the compiled library) it runs the pure-torch reference
(:mod:`exl3_kernels.reference`), which is also what every kernel is tested against.

The op is registered with ``torch.library`` (schema + CUDA/CPU impls + fake), so it is opaque to
``torch.compile(fullgraph=True)`` and capture-safe (no host sync, no allocation of persistent memory
during capture).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from . import _ops, autotune, env, workspace
from .plan import BM_TIERS, LayerShape, Plan

CODEBOOK_IDS = {"3inst": 0, "mcg": 1, "mul1": 2}
CODEBOOK_NAMES = {v: k for k, v in CODEBOOK_IDS.items()}

# Whether the input transform before a GEMM lets the GEMM launch before its own wait for the previous kernel
# (_ops.input_transform(early=True)) instead of right after it. A/B studies set it (bench/bench_gemm.py --it-early);
# the default and the measurement behind it: docs/kernels.md, "The input transform is a PDL launch". With it, the
# GEMM's pre-wait part (trellis prefetch; the wgmma GEMM also stages svh and bias) may overlap the kernel two back
# (the previous op's last one), so the GEMM contract of ops.cpp ("the kernel launched just before must not write the
# trellis") then extends to that kernel and to svh and bias: true for the layers of this package, whose weights no
# kernel writes.
IT_EARLY = False


@dataclass
class Exl3Layer:
    """Tensors of one (possibly fused) EXL3 layer on one device.

    Attributes:
        trellis: per shard int16 [k/16, n_s/16, 16 K_s] (K_s may differ between shards).
        suh: per shard fp16 [k].
        svh: per shard fp16 [n_s].
        codebook: "3inst", "mcg" or "mul1" (shared by all shards).
        bias: [sum n_s] or None (fp32 preferred: the GEMM epilogue reads fp32).
    """

    trellis: list[torch.Tensor]
    suh: list[torch.Tensor]
    svh: list[torch.Tensor]
    codebook: str
    bias: torch.Tensor | None = None

    @property
    def k(self) -> int:
        return self.trellis[0].shape[0] * 16

    @property
    def n_total(self) -> int:
        return sum(t.shape[1] * 16 for t in self.trellis)


def layer_shape(trellis: list[torch.Tensor], codebook: int) -> LayerShape:
    """The planner's key of a layer: k, per-shard n and K2 = 2K (from the trellis shapes), codebook id."""
    return LayerShape(trellis[0].shape[0] * 16, tuple(t.shape[1] * 16 for t in trellis),
                      tuple(t.shape[2] // 8 for t in trellis), codebook)


def _reference(x2, trellis, suh, svh, bias, codebook: int) -> torch.Tensor:
    from . import reference

    cb = CODEBOOK_NAMES[codebook]
    ys = [reference.linear_forward(x2, t, su, sv, cb, out_dtype=torch.float32) for t, su, sv in zip(trellis, suh, svh)]
    y = torch.cat(ys, dim=-1)
    if bias is not None:
        y = y + bias.float()
    return y.to(x2.dtype)


def _run_reconstruct_act(x2, trellis, suh, svh, bias32, codebook: int) -> torch.Tensor:
    """Dense Ŵ (no transforms) + cuBLAS, with the Hadamards on the activations.

    acc[:, shard s] = had_k(x * suh_s) @ Ŵ_s (fp16 x fp16 -> fp32, cuBLAS writes straight into the split-k
    workspace), then y = output_transform(acc) = had_n(acc) * svh / sqrt(128) + bias, which re-zeroes the
    workspace. Ŵ is built transposed, [n, k], by ``reconstruct_t_out`` (35 us for 4096 x 11008 at K = 4
    against 54 us for Ŵ [k, n] from the shared-memory reconstruct kernel; cuBLAS takes the transpose view at
    the same speed: bench/results/profiles/breakdown-ab-*-bc3eef7.txt). Rows go in chunks that fit the
    workspace; Ŵ is built once when it fits the reconstruct workspace whole, else once per (row chunk,
    column chunk).
    """
    k, m = x2.shape[1], x2.shape[0]
    ns = [t.shape[1] * 16 for t in trellis]
    n_total = sum(ns)
    starts = [sum(ns[:i]) for i in range(len(ns))]
    if bias32 is not None and (bias32.shape != (n_total,) or bias32.data_ptr() % 16):
        # refused here, before cuBLAS writes into the shared workspace (output_transform would refuse it later)
        raise ValueError(f"exl3_kernels.linear: bias must be fp32 [{n_total}], 16-byte aligned; got "
                         f"{tuple(bias32.shape)} at address {bias32.data_ptr()}")
    xh = _ops.input_transform(x2, suh)  # [S, m, k] fp16
    acc = workspace.splitk_acc(x2.device)
    rows = max(1, min(m, acc.numel() // n_total))
    cols = max(128, min(n_total, workspace.recon_capacity_bytes() // (2 * k) // 128 * 128))
    whole = cols >= n_total
    w_whole = None
    if whole:
        w_whole = workspace.recon(x2.device, k * n_total, torch.float16).view(n_total, k)
        torch.ops.exl3_kernels.reconstruct_t_out(w_whole, trellis, svh, codebook, 0, n_total)
    ys = []
    for r0 in range(0, m, rows):
        r1 = min(m, r0 + rows)
        acc2 = acc[: (r1 - r0) * n_total].view(r1 - r0, n_total)
        try:
            for c0 in range(0, n_total, cols):
                c1 = min(n_total, c0 + cols)
                if whole:
                    w = w_whole
                else:
                    w = workspace.recon(x2.device, k * (c1 - c0), torch.float16).view(c1 - c0, k)
                    torch.ops.exl3_kernels.reconstruct_t_out(w, trellis, svh, codebook, c0, c1)
                for s, (s0, n) in enumerate(zip(starts, ns)):
                    a, b = max(c0, s0), min(c1, s0 + n)
                    if a < b:  # Ŵ^T rows a..b, read by cuBLAS as the [k, b - a] operand
                        torch.mm(xh[s, r0:r1], w[a - c0:b - c0].t(), out_dtype=torch.float32, out=acc2[:, a:b])
            ys.append(_ops.output_transform(acc, svh, bias32, r1 - r0, x2.dtype))
        except BaseException:
            acc2.zero_()  # keep the workspace contract (all zero between ops) for every later split-k GEMM
            raise
    return ys[0] if len(ys) == 1 else torch.cat(ys, dim=0)


def _run_reconstruct_n(x2, trellis, suh, svh, bias32, codebook: int) -> torch.Tensor:
    """Output transform folded into the weight, input transform on the activations, one cuBLAS call per shard.

    y[:, shard s] = xh_s @ W_n,s (+ bias), with xh_s = had_k(x * suh_s) / sqrt(128) from :func:`_ops.input_transform`
    in x's dtype and W_n,s = Ŵ_s H_n diag(svh_s) / sqrt(128) from ``reconstruct_n_out``, also in x's dtype:
    cuBLAS writes y directly (fp32 accumulation inside, one rounding), so there is no fp32 accumulator pass
    (reconstruct_act) and no k-direction transform of W (reconstruct). Columns go in chunks that fit the
    reconstruct workspace. Precision: like the reconstruct path (weights rounded to x's dtype) plus the
    rounding of the rotated activations to x's dtype (bf16: up to 2^-8 relative; the GEMM path keeps them in
    fp16). In a CPU emulation of the GPU tests' shapes (bf16) the relative error against the reference was
    2.9e-3, against 2.4e-3 for reconstruct and 1.7e-3 for the GEMM path; fp16: 4.3e-4.
    """
    k, m = x2.shape[1], x2.shape[0]
    ns = [t.shape[1] * 16 for t in trellis]
    n_total = sum(ns)
    starts = [sum(ns[:i]) for i in range(len(ns))]
    if bias32 is not None and bias32.shape != (n_total,):
        raise ValueError(f"exl3_kernels.linear: bias must be fp32 [{n_total}], got {tuple(bias32.shape)}")
    # the bias cast (a kernel) goes first, so the input transform is the kernel right before W_n's first chunk
    bias = bias32.to(x2.dtype) if bias32 is not None else None
    xh = _ops.input_transform(x2, suh, x2.dtype)  # [S, m, k] in x's dtype
    y = torch.empty(m, n_total, dtype=x2.dtype, device=x2.device)
    cols = max(128, workspace.recon_capacity_bytes() // (2 * k) // 128 * 128)
    for c0 in range(0, n_total, cols):
        c1 = min(n_total, c0 + cols)
        w = workspace.recon(x2.device, k * (c1 - c0), x2.dtype).view(k, c1 - c0)
        # the first chunk directly follows the input transform, which it may overlap (PDL, see _ops.reconstruct_n_out):
        # safe because the input transform lets it launch only after its own wait for the kernel before it (a plain
        # launch, or PDL without `early`: input.cu), so the previous op's GEMM reading this workspace has finished
        # by then; a later chunk follows the cuBLAS GEMM that still reads the workspace, so it launches plainly
        _ops.reconstruct_n_out(w, trellis, svh, codebook, c0, c1, pdl=c0 == 0)
        for s, (s0, n) in enumerate(zip(starts, ns)):
            a, b = max(c0, s0), min(c1, s0 + n)
            if a < b:
                if bias is not None:
                    # as the reconstruct path: cuBLAS adds the bias in the output dtype
                    torch.addmm(bias[a:b], xh[s], w[:, a - c0:b - c0], out=y[:, a:b])
                else:
                    torch.mm(xh[s], w[:, a - c0:b - c0], out=y[:, a:b])
    return y


def _run_plan(plan: Plan, x2, trellis, suh, svh, bias32, codebook: int) -> torch.Tensor:
    if plan.path == "reconstruct_act":
        return _run_reconstruct_act(x2, trellis, suh, svh, bias32, codebook)
    if plan.path == "reconstruct_n":
        return _run_reconstruct_n(x2, trellis, suh, svh, bias32, codebook)
    if plan.path == "reconstruct":
        k = x2.shape[1]
        n_total = sum(t.shape[1] * 16 for t in trellis)
        cols = max(128, workspace.recon_capacity_bytes() // (2 * k) // 128 * 128)
        outs = []
        for c0 in range(0, n_total, cols):
            c1 = min(n_total, c0 + cols)
            w = workspace.recon(x2.device, k * (c1 - c0), x2.dtype).view(k, c1 - c0)
            _ops.reconstruct_out(w, trellis, suh, svh, codebook, c0, c1, True)
            if bias32 is not None:
                # cuBLAS adds the bias in the output dtype (rounded twice with bf16); the gemm path adds it in
                # fp32 before its single rounding, so the two paths differ by up to one output ulp there.
                outs.append(torch.addmm(bias32[c0:c1].to(x2.dtype), x2, w))
            else:
                outs.append(torch.mm(x2, w))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
    rs_cluster = plan.path == "wgmma_rs" and plan.cluster and plan.split > 1
    if (plan.path == "wgmma_rs" and not rs_cluster
            and x2.shape[0] * sum(t.shape[1] * 16 for t in trellis) > workspace.splitk_capacity()):
        # a pinned wgmma_rs plan (the autotuner never offers one that does not fit, plan.rs_plans) at an m whose outputs
        # exceed the accumulator, which this kernel needs at every split: the mma.sync GEMM at split 1 instead
        _warn_rs_fallback(x2.shape[0])
        plan = Plan("gemm", max(b for cb, b in _ops.built_instances() if cb == codebook), 1)
    if plan.path == "wgmma_rs":  # the kernel reduces through the accumulator at every split, or in a cluster
        xh = _ops.input_transform(x2, suh, early=IT_EARLY)
        if rs_cluster:  # no accumulator (any fp32 tensor stands in) and no tile counters
            return _ops.gemm_wgmma_rs(xh, trellis, svh, bias32, codebook, plan.bm, plan.split,
                                      workspace.splitk_acc(x2.device), x2.dtype, cluster=True)
        return _ops.gemm_wgmma_rs(xh, trellis, svh, bias32, codebook, plan.bm, plan.split,
                                  workspace.splitk_acc(x2.device), x2.dtype,
                                  tile_flags=_tile_flags(x2, trellis, plan.bm))
    if plan.path == "wgmma":
        xh = _ops.input_transform(x2, suh, early=IT_EARLY)
        if plan.stream_k and _ops.wgmma_has_stream_k():
            blocks = autotune.sm_count(x2.device)
            return _ops.gemm_wgmma(xh, trellis, svh, bias32, codebook, 1, workspace.sk_slots(x2.device, blocks),
                                   x2.dtype, stream_k=blocks)
        acc = workspace.splitk_acc(x2.device) if plan.split > 1 else xh
        return _ops.gemm_wgmma(xh, trellis, svh, bias32, codebook, plan.split, acc, x2.dtype)
    if plan.fused_it:  # one kernel (two with split-k through the accumulator when no tile counters are passed): no input transform node
        acc = workspace.splitk_acc(x2.device) if plan.split > 1 else x2  # not touched (nor size-checked) by a cluster
        return _ops.gemm_x(x2, trellis, suh, svh, bias32, codebook, plan.split, acc, x2.dtype,
                           True if plan.cluster else None,
                           tile_flags=_tile_flags(x2, trellis, plan.bm) if plan.split > 1 and not plan.cluster else None,
                           lohi=plan.lohi)
    xh = _ops.input_transform(x2, suh, lohi=plan.lohi, early=IT_EARLY)
    acc = workspace.splitk_acc(x2.device) if plan.split > 1 else xh
    # a cluster plan reduces in a cluster; otherwise CUDA_EXL3_CLUSTER decides (unset / 0: the accumulator)
    cluster = True if plan.cluster else None
    flags = _tile_flags(x2, trellis, plan.bm) if plan.split > 1 and not plan.cluster else None
    return _ops.gemm(xh, trellis, svh, bias32, codebook, plan.bm, plan.split, acc, x2.dtype, plan.lohi, cluster,
                     tile_flags=flags)


def _tile_flags(x2: torch.Tensor, trellis: list[torch.Tensor], bm: int) -> torch.Tensor | None:
    """The tile counters that let a GEMM finish split-k itself (workspace.splitk_flags), or None: m above
    plan.SPLITK_FINISH_MAX_M or CUDA_EXL3_SPLITK_FINISH off (autotune.splitk_finish_on), or more output tiles than
    counters (the split-k epilogue kernel then runs)."""
    if not autotune.splitk_finish_on(x2.shape[0]):
        return None
    tiles = -(-x2.shape[0] // bm) * (sum(t.shape[1] * 16 for t in trellis) // 128)
    return workspace.splitk_flags(x2.device) if tiles <= workspace.SPLITK_FLAGS else None


_rs_fallback_warned = False


def _warn_rs_fallback(m: int) -> None:
    global _rs_fallback_warned
    if not _rs_fallback_warned:
        _rs_fallback_warned = True
        warnings.warn(f"exl3_kernels: CUDA_EXL3_PATH=wgmma_rs at m = {m}: the outputs exceed the split-k accumulator "
                      "(CUDA_EXL3_SPLITK_WORKSPACE_MB), which that kernel needs; running the mma.sync GEMM at split 1",
                      RuntimeWarning, stacklevel=3)


def _check_aligned(tensors: list[torch.Tensor], what: str) -> None:
    # the kernels read these with 16-byte (trellis: cp.async / uint4) and 8-byte (suh, svh) vector loads
    for i, t in enumerate(tensors):
        if t.data_ptr() % 16:
            raise ValueError(f"exl3_kernels.linear: {what}[{i}] starts at an address that is not 16-byte aligned "
                             f"(a view with a storage offset?); pass a contiguous copy")


def _linear_cuda(x, trellis, suh, svh, bias, codebook: int) -> torch.Tensor:
    if not torch.cuda.is_current_stream_capturing():
        _ops.check_device(x.device)  # once per device: clear error for a missing build or architecture
    _check_aligned(trellis, "trellis")
    _check_aligned(suh, "suh")
    _check_aligned(svh, "svh")
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1 or x2.stride(0) % 4 != 0 or x2.data_ptr() % 16:
        x2 = x2.contiguous() if not x2.is_contiguous() else x2.clone()
    n_total = sum(t.shape[1] * 16 for t in trellis)
    m = x2.shape[0]
    if m == 0:
        return x.new_empty((*x.shape[:-1], n_total))
    bias32 = None
    if bias is not None:
        bias32 = bias if bias.dtype == torch.float32 and bias.is_contiguous() else bias.float().contiguous()
    shape = layer_shape(trellis, codebook)
    built = tuple(sorted({bm for cb, bm in _ops.built_instances() if cb == codebook})) or BM_TIERS
    # CUDA_EXL3_LOHI=0: no lohi candidate is timed (the pin would turn a winning one into a plan never timed)
    lohi_off = env.get("LOHI") not in (None, "") and not env.get_bool("LOHI")
    lohi_bm = () if lohi_off else tuple(sorted({bm for cb, bm in _ops.built_instances(lohi=True) if cb == codebook}))
    wgmma = wgmma_offered(x2.device, codebook)
    wgmma_rs = wgmma_rs_offered(x2.device, codebook)
    wgmma_sk = wgmma and wgmma_sk_offered()
    cluster = _ops.cluster_splitk_available(x2.device) and autotune.cluster_mode() is not False
    fused_it = _ops.gemm_x_built() and env.get_bool("FUSED_IT", True)
    if not autotune.is_cached(shape, m, x2.dtype, x2.device):  # first call in this bucket: tune the smaller ones too
        autotune.prime_smaller_buckets(shape, m, x2.dtype, x2.device, workspace.splitk_capacity(), built,
                                       lambda p, rows: _run_plan(p, x2[:rows], trellis, suh, svh, bias32, codebook),
                                       lohi_bm, wgmma, cluster, fused_it, wgmma_rs, wgmma_sk)
    plan = autotune.choose(shape, m, x2.dtype, x2.device, workspace.splitk_capacity(), built,
                           lambda p: _run_plan(p, x2, trellis, suh, svh, bias32, codebook), lohi_bm, wgmma, cluster,
                           fused_it, wgmma_rs, wgmma_sk)
    y = _run_plan(plan, x2, trellis, suh, svh, bias32, codebook)
    return y.reshape(*x.shape[:-1], n_total)


def _linear_cpu(x, trellis, suh, svh, bias, codebook: int) -> torch.Tensor:
    k = x.shape[-1]
    y = _reference(x.reshape(-1, k), trellis, suh, svh, bias, codebook)
    return y.reshape(*x.shape[:-1], y.shape[-1])


_lib = None


def _register() -> None:
    """Define ``exl3_kernels::linear`` (CUDA impl needs the compiled library; CPU impl = reference)."""
    global _lib
    if _lib is not None:
        return
    have_cuda_ops = _ops.load()
    # FRAGMENT: extends the namespace defined by the compiled library, or creates it when absent.
    _lib = torch.library.Library("exl3_kernels", "FRAGMENT")
    _lib.define("linear(Tensor x, Tensor[] trellis, Tensor[] suh, Tensor[] svh, Tensor? bias, int codebook) -> Tensor")
    if have_cuda_ops:
        _lib.impl("linear", _linear_cuda, "CUDA")
    _lib.impl("linear", _linear_cpu, "CPU")

    @torch.library.register_fake("exl3_kernels::linear")
    def _(x, trellis, suh, svh, bias, codebook):
        n_total = sum(t.shape[1] * 16 for t in trellis)
        return x.new_empty((*x.shape[:-1], n_total))


_register()


def wgmma_offered(device: torch.device, codebook: int) -> bool:
    """Whether the autotuner may time the wgmma GEMM for this layer: usable on ``device`` (built for ``codebook``,
    compute capability 9.0) and not switched off with CUDA_EXL3_WGMMA=0 (on by default since its GPU tests passed on
    the H200, 4d792ef). The pin CUDA_EXL3_PATH=wgmma does not depend on it."""
    return env.get_bool("WGMMA", True) and _ops.wgmma_usable(device, codebook)


def wgmma_sk_offered() -> bool:
    """Whether the autotuner may time the wgmma GEMM's stream-k form (with :func:`wgmma_offered`): the library's op
    takes ``stream_k`` and CUDA_EXL3_WGMMA_SK=0 does not switch it off."""
    return env.get_bool("WGMMA_SK", True) and _ops.wgmma_has_stream_k()


def wgmma_rs_offered(device: torch.device, codebook: int) -> bool:
    """Whether the autotuner may time the register-A Hopper GEMM for this layer: usable on ``device``
    (:func:`_ops.wgmma_rs_usable`) and not switched off with CUDA_EXL3_WGMMA_RS=0. The pin CUDA_EXL3_PATH=wgmma_rs does
    not depend on it."""
    return env.get_bool("WGMMA_RS", True) and _ops.wgmma_rs_usable(device, codebook)


def exl3_linear(x: torch.Tensor, layer: Exl3Layer) -> torch.Tensor:
    """y = EXL3 linear of ``layer`` applied to x. Functional: allocates and returns y.

    Args:
        x: [..., k] fp16 or bf16 (CUDA: kernels; CPU: reference; fp32 accepted on CPU).
        layer: the layer's tensors (see :class:`Exl3Layer`).
    Returns:
        [..., sum n_s] in x's dtype.
    Raises:
        RuntimeError (CUDA op) or ValueError (CPU reference, misaligned tensors) naming the offending tensor on
        shape/dtype/device mismatch; RuntimeError from :func:`exl3_kernels._ops.check_device` when the compiled
        library is missing or has no code for the GPU's architecture.
    """
    return torch.ops.exl3_kernels.linear(x, layer.trellis, layer.suh, layer.svh, layer.bias,
                                         CODEBOOK_IDS[str(getattr(layer.codebook, "value", layer.codebook))])
