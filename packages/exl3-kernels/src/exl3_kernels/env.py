"""Environment variables of exl3-kernels, read at call time (never cached at import).

Every variable is ``CUDA_EXL3_<NAME>``; the old spelling ``VLLM_EXL3_<NAME>`` is still accepted and
triggers a ``FutureWarning`` (once per name; FutureWarning is shown by default, DeprecationWarning from a
library is not). Errors about a bad value name the spelling that was actually read.

| variable | meaning | default |
|---|---|---|
| CUDA_EXL3_PATH | force the path: ``gemm`` (trellis GEMM), ``reconstruct`` (dense W + cuBLAS), ``reconstruct_act`` (dense Ŵ + cuBLAS, Hadamards on the activations), ``reconstruct_n`` (output Hadamard folded into the dense weight, input Hadamard on the activations) , ``wgmma`` (the Hopper wgmma trellis GEMM, BM 256) or ``wgmma_rs`` (the register-A Hopper GEMM, BM 8-128); the two wgmma paths need compute capability 9.0 and a build with 9.0 | unset: planner |
| CUDA_EXL3_BM | force the GEMM row tile BM (8, 16, 32, 64, 128; 8 is the lohi variant with swapped operands, the smallest plain tier where that is not built or CUDA_EXL3_LOHI=0; with the wgmma_rs path 8, 16, 32, 64, 128) | unset: planner |
| CUDA_EXL3_SPLIT | force the split-k factor (1 = no split) | unset: planner |
| CUDA_EXL3_LOHI | 1: use the GEMM's lohi variant wherever the plan has an instance of it (gemm path, BM 8 and 16, 3inst / mcg: the tensor core adds the two halves of each decoded weight); 0: never (no lohi plan is timed; a pinned BM 8 plan becomes the smallest plain tier) | unset: planner |
| CUDA_EXL3_AUTOTUNE | 1: time candidate plans once per (layer shape, m bucket) outside graph capture | 1 |
| CUDA_EXL3_AUTOTUNE_GRAPH | 1: time the candidates of m buckets up to 256 as CUDA-graph replays (each call after an L2 flush, inside one graph; the flushes' own replay subtracted) instead of eagerly; measured no better than eager timing (``autotune`` module docstring) | 0 |
| CUDA_EXL3_AUTOTUNE_PRIME | 1: the first call in an untuned m bucket also tunes every smaller power-of-two bucket on its first rows (vLLM's profile run then tunes them all at start-up) | 1 |
| CUDA_EXL3_DETERMINISTIC | 1: no atomics (split = 1, or on sm_90+ with a library that has it, and CUDA_EXL3_CLUSTER not 0, split-k up to 8 reduced inside a thread block cluster in a fixed order) and a fixed, timing-free path choice: bit-identical reruns | 0 |
| CUDA_EXL3_RECON_MIN_M | smallest m for which the cost model picks the reconstruct path | 1024 |
| CUDA_EXL3_RECON_TMA | 0: the bf16 reconstruct kernel (large-m path) writes W with LDS / STG instead of TMA stores (compute capability 9.0+; same values; for comparison, or as the way out if the driver cannot encode W's tensor map, which is then an error). Read by ``_ops.reconstruct`` / ``reconstruct_out`` at each call, a captured CUDA graph keeps its capture-time setting; libraries built before it ignore it | 1 |
| CUDA_EXL3_RECON_WORKSPACE_MB | size cap of the dense-W workspace; bigger layers are built in column chunks | 512 |
| CUDA_EXL3_SPLITK_WORKSPACE_MB | size of the split-k fp32 accumulator; larger m x n disables split-k | 64 |
| CUDA_EXL3_LIBRARY | path of the compiled op library to load instead of the packaged ``_C.abi3.so`` | unset |
| CUDA_EXL3_WGMMA | 0: do not offer the Hopper wgmma GEMM (compute capability 9.0, built with 9.0) to the autotuner from m = 128; the pin CUDA_EXL3_PATH=wgmma works either way | 1 |
| CUDA_EXL3_WGMMA_RS | 0: do not offer the register-A Hopper GEMM (compute capability 9.0, built with 9.0) to the autotuner up to m = 256; the pin CUDA_EXL3_PATH=wgmma_rs works either way (where m x n exceeds the split-k accumulator, which this kernel needs at every split, the pinned layer runs the mma.sync GEMM at split 1 with a warning) | 1 |
| CUDA_EXL3_WGMMA_RS_CLUSTER | 0: do not time the register-A GEMM's cluster plans (split-k reduced inside a thread block cluster, m = 32..256; A/B studies); pins and deterministic mode are unaffected | 1 |
| CUDA_EXL3_WGMMA_SK | 0: do not offer the stream-k form of the Hopper wgmma GEMM (one block per SM sharing the output tiles' k stages; partial sums handed over through a workspace of its own, workspace.sk_slots, no epilogue kernel) to the autotuner from m = 128 | 1 |
| CUDA_EXL3_CLUSTER | split-k reduced through distributed shared memory inside one thread block cluster (mma.sync path, split 2..16, compute capability 9.0+) instead of the fp32 accumulator + epilogue kernel (one kernel per op instead of two; bit-identical reruns). Unset: the autotuner times cluster plans (m = 32..256, split <= 8; the register-A GEMM's too, where its library has them) next to the accumulator ones and deterministic mode plans split-k through clusters; 1: every split-k mma.sync GEMM with split 2..16 uses it (register-A plans only where tuned or pinned as cluster plans: none are timed then); 0: never (deterministic mode then runs split 1). Read by ``_ops.gemm`` at each call; a captured CUDA graph keeps its capture-time setting; libraries built before it ignore it | unset |
| CUDA_EXL3_FUSED_IT | 0: the autotuner does not time the GEMM with the input transform inside (``_ops.gemm_x``: one kernel instead of input transform + GEMM; BM16 offered for m <= 16 and the BM 8 swapped lohi form for m <= 8, where a k slice fits 1024 columns) | 1 |
| CUDA_EXL3_SPLITK_FINISH | 0: at m <= 16 (plan.SPLITK_FINISH_MAX_M; above it the epilogue kernel always runs) split-k plans through the accumulator (and every register-A plan) run the split-k epilogue kernel after the GEMM, instead of the GEMM's last split block of each output tile writing y (tile counters, ``workspace.splitk_flags``; one graph node fewer per op). Read by ``linear`` at each call (part of the autotuner's plan key); a captured CUDA graph keeps its capture-time setting; libraries built before it ignore it | 1 |
| CUDA_EXL3_A_WHOLE | 0: the unfused BM 8 lohi / BM16 GEMMs keep their A ring where they would copy A whole before the k loop (k slices of 512-1024 columns; csrc/gemm/gemm_kernel.cuh "A copied whole"; outputs bit-identical either way). Read by ``_ops.gemm`` at each call; a captured CUDA graph keeps its capture-time setting; libraries built before it ignore it | 1 |
| CUDA_EXL3_PDL | 0: launch the input transform, the GEMM and its split-k epilogue without programmatic dependent launch (sm_90+ only; a GEMM grid below one block per SM takes it only where CUDA_EXL3_SPREAD is on and the launch is not a cluster or stream-k launch; read by ``_ops.input_transform`` / ``_ops.gemm`` at each call, a captured CUDA graph keeps its capture-time setting) | 1 |
| CUDA_EXL3_SPREAD | 0: a GEMM grid below one full wave (mma.sync and register-A GEMMs, not the cluster forms) launches with the shared memory it needs, instead of enough that no SM can hold more than ceil(blocks / SMs) of its blocks (csrc/include/exl3/spread.h; outputs unchanged); GEMM grids below one block per SM (these and the wgmma GEMM's) then also launch without PDL, as before the rule. Read by the op library at each launch (the Python GEMM wrappers check the value); a captured CUDA graph keeps its capture-time setting; libraries built before it ignore it | 1 |
"""
from __future__ import annotations

import os
import warnings

_warned: set[str] = set()


def _lookup(name: str) -> tuple[str, str] | None:
    """(spelling read, value) of ``CUDA_EXL3_<name>`` or the deprecated ``VLLM_EXL3_<name>``, or None."""
    new = f"CUDA_EXL3_{name}"
    if new in os.environ:
        return new, os.environ[new]
    old = f"VLLM_EXL3_{name}"
    if old in os.environ:
        if old not in _warned:
            _warned.add(old)
            warnings.warn(f"{old} is deprecated; use {new}", FutureWarning, stacklevel=3)
        return old, os.environ[old]
    return None


def get(name: str, default: str | None = None) -> str | None:
    """Return ``CUDA_EXL3_<name>``, falling back to the deprecated ``VLLM_EXL3_<name>``.

    Args:
        name: variable name without prefix, e.g. ``"BM"``.
        default: value when neither spelling is set.
    """
    found = _lookup(name)
    return default if found is None else found[1]


def get_int(name: str, default: int | None = None) -> int | None:
    """Integer variant of :func:`get`; raises ``ValueError`` naming the variable on a non-integer value."""
    found = _lookup(name)
    if found is None or found[1] == "":
        return default
    try:
        return int(found[1])
    except ValueError:
        raise ValueError(f"{found[0]} must be an integer, got {found[1]!r}") from None


def get_bool(name: str, default: bool = False) -> bool:
    """Boolean variant of :func:`get`: ``1/true/yes/on`` are true, ``0/false/no/off/''`` false."""
    found = _lookup(name)
    if found is None:
        return default
    s = found[1].strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{found[0]} must be a boolean (0/1), got {found[1]!r}")
