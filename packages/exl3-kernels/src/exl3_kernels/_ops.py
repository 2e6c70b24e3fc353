"""Typed wrappers over ``torch.ops.exl3_kernels.*`` (the compiled library) with their fake impls.

The library ``_C.abi3.so`` registers its ops with TORCH_LIBRARY (csrc/bindings/ops.cpp); it is loaded
with ``torch.ops.load_library`` (no Python module, no pybind). Fake (meta) implementations are
registered here so the ops trace under ``torch.compile(fullgraph=True)`` and CUDA-graph capture.
Importing this module never fails: :func:`available` says whether the CUDA ops exist.
"""
from __future__ import annotations

import functools
from pathlib import Path

import torch

from . import env

_loaded: bool | None = None
_load_error: str | None = None


def _library_path() -> Path:
    override = env.get("LIBRARY")
    if override:
        return Path(override)
    here = Path(__file__).resolve().parent
    cands = sorted(here.glob("_C*.so"))
    return cands[0] if cands else here / "_C.abi3.so"


def load() -> bool:
    """Load the compiled op library once. Returns True when the ``exl3_kernels`` ops are registered."""
    global _loaded, _load_error
    if _loaded is not None:
        return _loaded
    path = _library_path()
    try:
        if not path.exists():
            raise FileNotFoundError(f"{path} does not exist (package built without nvcc?)")
        torch.ops.load_library(str(path))
        _register_fakes()
        _loaded = True
    except Exception as e:  # noqa: BLE001 - reported through available()/load_error()
        _loaded = False
        _load_error = f"{type(e).__name__}: {e}"
    return _loaded


def available() -> bool:
    """True when the compiled library is loaded (the ops can be traced; running needs CUDA tensors)."""
    return load()


def load_error() -> str | None:
    """Why :func:`load` failed, or None."""
    load()
    return _load_error


_checked_devices: set[int] = set()


def check_device(device: torch.device | str) -> None:
    """Raise a clear error unless the compiled kernels can run on ``device`` (a CUDA device).

    Checks that the op library is loaded and that it holds machine code for the device's architecture, by
    launching the smallest kernel once per device (a build for other architectures fails there with CUDA's
    "no kernel image" error). Cached per device; cheap afterwards.

    Raises:
        RuntimeError: naming the device, its compute capability, the load error or the missing architecture,
            and how to rebuild (``TORCH_CUDA_ARCH_LIST``, nvcc).
    """
    device = torch.device(device)
    if device.type != "cuda":
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index in _checked_devices:
        return
    cap = torch.cuda.get_device_capability(index)
    if not load():
        raise RuntimeError(
            f"exl3_kernels: the compiled CUDA library is not available ({_load_error}). It is built when the "
            "package is installed on a machine with nvcc (CUDA 12.8+) and torch 2.11: reinstall exl3-kernels there "
            "(e.g. `uv sync --all-packages --reinstall-package exl3-kernels`), with CUDA_HOME pointing at the toolkit.")
    try:
        decode_lut(0, torch.device("cuda", index))
        torch.cuda.synchronize(index)
    except RuntimeError as e:
        raise RuntimeError(
            f"exl3_kernels: the compiled library has no code for cuda:{index} (compute capability "
            f"{cap[0]}.{cap[1]}): {e}. Rebuild with TORCH_CUDA_ARCH_LIST including {cap[0]}.{cap[1]} "
            "(the default build targets 9.0 and 12.0).") from e
    _checked_devices.add(index)


def _register_fakes() -> None:
    lib = "exl3_kernels::"

    @torch.library.register_fake(lib + "input_transform")
    def _(x, suh, out_dtype=None, lohi=False, pdl=0):
        return x.new_empty((len(suh), x.shape[0], x.shape[1] * (2 if lohi else 1)), dtype=out_dtype or torch.float16)

    @torch.library.register_fake(lib + "gemm")
    def _(xh, trellis, svh, bias, codebook, bm, split, acc, out_dtype, pdl=False, lohi=False, cluster=False,
          tile_flags=None, a_whole=True):
        n_total = sum(t.shape[1] * 16 for t in trellis)
        return xh.new_empty((xh.shape[1], n_total), dtype=out_dtype)

    if hasattr(torch.ops.exl3_kernels, "gemm_x"):  # libraries built before the fused input transform lack the op
        @torch.library.register_fake(lib + "gemm_x")
        def _(x, trellis, suh, svh, bias, codebook, split, acc, out_dtype, pdl=False, cluster=False, tile_flags=None,
              lohi=False):
            n_total = sum(t.shape[1] * 16 for t in trellis)
            return x.new_empty((x.shape[0], n_total), dtype=out_dtype)

    if hasattr(torch.ops.exl3_kernels, "gemm_wgmma"):  # libraries built before the wgmma GEMM lack the op
        @torch.library.register_fake(lib + "gemm_wgmma")
        def _(xh, trellis, svh, bias, codebook, split, acc, out_dtype, pdl=False, stream_k=0):
            n_total = sum(t.shape[1] * 16 for t in trellis)
            return xh.new_empty((xh.shape[1], n_total), dtype=out_dtype)

    if hasattr(torch.ops.exl3_kernels, "gemm_wgmma_rs"):  # libraries built before the register-A GEMM lack the op
        @torch.library.register_fake(lib + "gemm_wgmma_rs")
        def _(xh, trellis, svh, bias, codebook, bm, split, acc, out_dtype, pdl=False, tile_flags=None, cluster=False):
            n_total = sum(t.shape[1] * 16 for t in trellis)
            return xh.new_empty((xh.shape[1], n_total), dtype=out_dtype)

    @torch.library.register_fake(lib + "output_transform")
    def _(acc, svh, bias, m, out_dtype):
        return acc.new_empty((m, sum(v.shape[0] for v in svh)), dtype=out_dtype)

    @torch.library.register_fake(lib + "reconstruct")
    def _(trellis, suh, svh, codebook, col_begin, col_end, dtype, transform, tma=True):
        n_total = sum(t.shape[1] * 16 for t in trellis)
        end = n_total if col_end < 0 else col_end
        return trellis[0].new_empty((trellis[0].shape[0] * 16, end - col_begin), dtype=dtype)


def input_transform(x: torch.Tensor, suh: list[torch.Tensor], out_dtype: torch.dtype = torch.float16,
                    lohi: bool = False, pdl: bool | None = None, early: bool = False) -> torch.Tensor:
    """xh[s] = round(had128(x * suh[s]) / sqrt(128)) for each shard s, one launch (fp32 inside, one rounding).

    Args:
        x: [m, k] fp16/bf16 CUDA, unit column stride, k % 128 == 0.
        suh: per shard, fp16 [k].
        out_dtype: torch.float16 (the GEMM's operand) or torch.bfloat16 (the reconstruct_n path with bf16 x).
        lohi: write the layout of the GEMM's lohi variant (fp16 only): [len(suh), m, 2k] where columns
            32 b .. 32 b + 15 hold xh[16 b + (j & ~1)] and 32 b + 16 .. 32 b + 31 hold xh[16 b + (j | 1)], j = 0..15.
        pdl: programmatic dependent launch on sm_90+ (None: CUDA_EXL3_PDL, default on, read at each call). The
            kernel may then be resident before the kernel ahead of it has finished and waits for it first thing
            (csrc/transform/input.cu), so the result is that of a plain launch; what it hides is this node's launch
            latency behind the previous kernel's tail. Libraries built before the argument launch plainly.
        early: with ``pdl``, let the next kernel launch before this one's wait (instead of right after it). Only for
            a GEMM next, which reads nothing but its trellis and parameters before its own wait; never before
            ``reconstruct_n_out`` with ``pdl`` (it writes its workspace before waiting).
    Returns:
        [len(suh), m, k] (or [len(suh), m, 2k] with ``lohi``) in ``out_dtype``.
    Raises:
        RuntimeError from the op on shape/dtype/device mismatch (message names the tensor).
        ValueError if CUDA_EXL3_PDL is not a boolean.
    """
    if pdl is None:
        pdl = env.get_bool("PDL", True)
    if pdl and _input_transform_has_pdl_arg():
        return torch.ops.exl3_kernels.input_transform(x, suh, out_dtype, lohi, 2 if early else 1)
    if lohi:
        return torch.ops.exl3_kernels.input_transform(x, suh, out_dtype, True)
    if out_dtype == torch.float16:  # the default: also works with libraries built before the out_dtype argument
        return torch.ops.exl3_kernels.input_transform(x, suh)
    return torch.ops.exl3_kernels.input_transform(x, suh, out_dtype)


_it_pdl_arg: bool | None = None


def _input_transform_has_pdl_arg() -> bool:
    """Whether the loaded library's input_transform schema has the ``pdl`` argument (read once: the library does not
    change within a process)."""
    global _it_pdl_arg
    if _it_pdl_arg is None:
        _it_pdl_arg = any(a.name == "pdl" for a in torch.ops.exl3_kernels.input_transform.default._schema.arguments)
    return _it_pdl_arg


def gemm(xh: torch.Tensor, trellis: list[torch.Tensor], svh: list[torch.Tensor], bias: torch.Tensor | None,
         codebook: int, bm: int, split: int, acc: torch.Tensor, out_dtype: torch.dtype, lohi: bool = False,
         cluster: bool | None = None, tile_flags: torch.Tensor | None = None,
         a_whole: bool | None = None) -> torch.Tensor:
    """Trellis GEMM with fused output transform: y = had_n(xh @ Ŵ) * svh + bias.

    Args:
        xh: fp16 [S, m, k] from :func:`input_transform`.
        trellis: per shard int16 [k/16, n_s/16, 16K]; shards may differ in K.
        svh: per shard fp16 [n_s].
        bias: fp32 [sum n_s] or None.
        codebook: 0 = 3inst, 1 = mcg, 2 = mul1 (all shards).
        bm: row tile (16, 32, 64, 128; built tiers in ``built_instances()``; with ``lohi`` also 8, the swapped-operand
            form, where ``built_instances(lohi=True)`` has it).
        split: split-k factor; > 1 uses ``acc`` (fp32, >= m * sum n_s elements, all zero; left all zero).
        out_dtype: torch.float16 or torch.bfloat16.
        lohi: the variant that leaves lo + hi of each decoded weight to the tensor core (3inst / mcg; built for the
            tiers in ``built_instances(lohi=True)``); ``xh`` must then come from ``input_transform(..., lohi=True)``.
    Returns:
        [m, sum n_s] in ``out_dtype``.

    On sm_90+ the GEMM and its split-k epilogue use programmatic dependent launch unless CUDA_EXL3_PDL=0 (read
    here, at every call; a captured CUDA graph keeps the setting of its capture): the GEMM then prefetches its
    first trellis stages while the kernel before it on the stream (the input transform) still runs, so that
    kernel must not write the trellis. A grid below one block per SM takes PDL only where CUDA_EXL3_SPREAD is on
    and the launch is not a cluster or stream-k launch (csrc/bindings/ops.cpp, gemm_setup; docs/kernels.md).

    ``cluster``: None = CUDA_EXL3_CLUSTER (read here, at every call); True / False override it. With it a split-k
    GEMM on sm_90+ (split 2..16) reduces its partial sums inside one thread block cluster
    (csrc/gemm/gemm_kernel.cuh, "Split-k in a cluster"): ``acc`` is then not touched (and its size not checked: any
    fp32 CUDA tensor will do), no epilogue kernel runs, and reruns are bit-identical. Libraries built before the option ignore the variable; ``cluster=True`` with such a
    library raises RuntimeError.

    ``tile_flags``: int32 counters (:func:`workspace.splitk_flags`, zero before and after, at least ceil(m / bm) x
    sum n_s / 128 of them) for a split-k GEMM through ``acc``: the last split block of each output tile writes y and
    re-zeroes ``acc`` (csrc/include/exl3/splitk_finish.cuh), so no epilogue kernel runs. Ignored at split 1, whenever
    ``cluster`` is in effect (also with CUDA_EXL3_CLUSTER=1 at splits above 16, where the op then falls back to the
    accumulator and its epilogue kernel), and by libraries built before it (:func:`has_tile_flags`, which looks at the
    gemm schema: the three GEMM ops of one library gained the argument together).

    ``a_whole``: None = CUDA_EXL3_A_WHOLE (default 1, read here at every call); False keeps the A ring of the BM 8 lohi
    / BM16 kernels where they would copy A whole before the k loop (csrc/gemm/gemm_kernel.cuh, "A copied whole"; where
    that happens: :func:`gemm_a_whole`). Both forms give bit-identical outputs. Libraries built before the option
    ignore it.
    """
    pdl = env.get_bool("PDL", True)
    env.get_bool("SPREAD", True)  # read again by the library at launch (exl3/spread.h); checked and warned about here
    if cluster is None:
        cluster = env.get_bool("CLUSTER", False) and _gemm_has_cluster_arg()
    elif cluster and not _gemm_has_cluster_arg():
        raise RuntimeError("exl3_kernels.gemm: cluster=True needs a library with the cluster split-k (this one predates it)")
    if a_whole is None:
        a_whole = env.get_bool("A_WHOLE", True)
    if not a_whole and _gemm_has_a_whole_arg():  # the full argument list (such a library has every earlier argument)
        flags = tile_flags if tile_flags is not None and split > 1 and not cluster else None
        return torch.ops.exl3_kernels.gemm(xh, trellis, svh, bias, codebook, bm, split, acc, out_dtype, pdl, lohi,
                                           bool(cluster and split > 1), flags, False)
    if tile_flags is not None and split > 1 and not cluster and has_tile_flags():
        return torch.ops.exl3_kernels.gemm(xh, trellis, svh, bias, codebook, bm, split, acc, out_dtype, pdl, lohi,
                                           False, tile_flags)
    if split > 1 and cluster:
        return torch.ops.exl3_kernels.gemm(xh, trellis, svh, bias, codebook, bm, split, acc, out_dtype, pdl, lohi, True)
    if not lohi:  # the default: also works with libraries built before the lohi argument
        return torch.ops.exl3_kernels.gemm(xh, trellis, svh, bias, codebook, bm, split, acc, out_dtype, pdl)
    return torch.ops.exl3_kernels.gemm(xh, trellis, svh, bias, codebook, bm, split, acc, out_dtype, pdl, True)


def gemm_x_built() -> bool:
    """Whether the loaded library has :func:`gemm_x` (the GEMM with the input transform inside)."""
    return available() and hasattr(torch.ops.exl3_kernels, "gemm_x")


def gemm_x_has_lohi() -> bool:
    """Whether the loaded library's :func:`gemm_x` takes ``lohi`` (the BM 8 swapped form with the input transform
    inside); libraries before it do not. Cached."""
    global _GEMM_X_LOHI
    if _GEMM_X_LOHI is None:
        _GEMM_X_LOHI = bool(gemm_x_built() and any(
            a.name == "lohi" for a in torch.ops.exl3_kernels.gemm_x.default._schema.arguments))
    return _GEMM_X_LOHI


_GEMM_X_LOHI: bool | None = None


def gemm_x(x: torch.Tensor, trellis: list[torch.Tensor], suh: list[torch.Tensor], svh: list[torch.Tensor],
           bias: torch.Tensor | None, codebook: int, split: int, acc: torch.Tensor, out_dtype: torch.dtype,
           cluster: bool | None = None, tile_flags: torch.Tensor | None = None, lohi: bool = False) -> torch.Tensor:
    """The trellis GEMM with the input transform inside: y = had_n(had_k(x * suh_s) @ Ŵ_s) * svh_s + bias, one
    kernel (two with split-k through the accumulator, one with ``tile_flags``), no xh in global memory (csrc/gemm/gemm_kernel.cuh, "Input
    transform inside the GEMM"). Each block transforms its own rows and k slice, bit-identical to
    :func:`input_transform`; every 128-column block of the output repeats that work, so it pays only at small m.
    BM16 without ``lohi``; with ``lohi`` the BM 8 swapped-operand form (3inst / mcg; its A buffers in the lohi layout),
    bit-identical to ``gemm(input_transform(x, suh, lohi=True), ..., bm=8, lohi=True)``.

    Args:
        x: fp16 or bf16 [m, k], unit column stride, row stride a multiple of 4, 8-byte aligned; k % 128 == 0.
        trellis, svh, bias, codebook, acc, out_dtype: as :func:`gemm`; suh: per shard fp16 [k].
        split: split-k factor; each k slice (:func:`plan.fused_it_slice`) must be at most 1024 columns.
        cluster: as :func:`gemm` (None = CUDA_EXL3_CLUSTER).
        tile_flags: as :func:`gemm` (with them a split-k plan is one kernel; ceil(m / 8) x n / 128 counters with lohi).
        lohi: the BM 8 swapped form (needs :func:`gemm_x_has_lohi`).
    Returns:
        [m, sum n_s] in ``out_dtype``.
    Raises:
        RuntimeError from the op on a slice above 1024 columns, a missing BM16 (BM 8 lohi) instance, a library whose
        gemm_x has no ``lohi``, or the checks of :func:`gemm`.
    """
    pdl = env.get_bool("PDL", True)
    env.get_bool("SPREAD", True)  # read again by the library at launch (exl3/spread.h); checked and warned about here
    if cluster is None:
        cluster = env.get_bool("CLUSTER", False)
    cluster = bool(cluster and split > 1)
    if lohi:
        if not gemm_x_has_lohi():
            raise RuntimeError("exl3_kernels.gemm_x: this library's gemm_x has no lohi form (BM 8 swapped); rebuild it")
        flags = tile_flags if tile_flags is not None and split > 1 and not cluster else None
        return torch.ops.exl3_kernels.gemm_x(x, trellis, suh, svh, bias, codebook, split, acc, out_dtype, pdl, cluster,
                                             flags, True)
    if tile_flags is not None and split > 1 and not cluster and has_tile_flags():
        return torch.ops.exl3_kernels.gemm_x(x, trellis, suh, svh, bias, codebook, split, acc, out_dtype, pdl, False,
                                             tile_flags)
    return torch.ops.exl3_kernels.gemm_x(x, trellis, suh, svh, bias, codebook, split, acc, out_dtype, pdl, cluster)


_TILE_FLAGS_ARG: bool | None = None


def has_tile_flags() -> bool:
    """Whether the loaded library's GEMMs take ``tile_flags`` (split-k finished inside the GEMM); cached."""
    global _TILE_FLAGS_ARG
    if _TILE_FLAGS_ARG is None:
        _TILE_FLAGS_ARG = bool(load() and any(
            a.name == "tile_flags" for a in torch.ops.exl3_kernels.gemm.default._schema.arguments))
    return _TILE_FLAGS_ARG


@functools.cache
def _op_has_arg(op: str, arg: str) -> bool:
    """Whether the loaded library's op ``op`` has the argument ``arg`` in its schema (older libraries lack the newer
    arguments); cached per (op, arg)."""
    return any(a.name == arg for a in getattr(torch.ops.exl3_kernels, op).default._schema.arguments)


def _gemm_has_cluster_arg() -> bool:
    """Whether the loaded library's gemm schema has the ``cluster`` argument (libraries before it do not)."""
    return _op_has_arg("gemm", "cluster")


def _gemm_has_a_whole_arg() -> bool:
    """Whether the loaded library's gemm schema has the ``a_whole`` argument (libraries before f659623's do not)."""
    return _op_has_arg("gemm", "a_whole")


def spread_smem(smem: int, blocks: int, occupancy: int) -> int | None:
    """Dynamic shared memory in bytes that a GEMM launch of ``blocks`` blocks, needing ``smem`` bytes each and fitting
    ``occupancy`` per SM by its other limits, asks for on the current CUDA device (csrc/include/exl3/spread.h, with
    CUDA_EXL3_SPREAD as set now): ``smem``, or more so that no SM can hold more than ceil(blocks / SMs) of the
    blocks. None for libraries built before the rule. For tests.

    Raises:
        RuntimeError from the op on negative sizes or occupancy < 1.
    """
    if not (available() and hasattr(torch.ops.exl3_kernels, "spread_smem")):
        return None
    return int(torch.ops.exl3_kernels.spread_smem(smem, blocks, occupancy))


def gemm_a_whole(bm: int, lohi: bool, k: int, split: int, max_k2: int) -> bool:
    """Whether :func:`gemm` at row tile ``bm`` (with ``lohi``), ``k`` input columns and ``split`` runs, on the current
    CUDA device, its kernel form that copies A (xh) whole before the k loop (csrc/gemm/gemm_kernel.cuh, "A copied
    whole", a_whole_fits): BM 8 lohi and BM16 where the k slice is 512-1024 columns and the block's shared memory
    (set by ``max_k2``, the largest K2 = 2K of the layer's shards) leaves 4 blocks per SM. False for libraries without
    the form. The op's output cannot show the form (it is bit-identical to the ring's): tests and profiles ask here.

    Raises RuntimeError for k not a multiple of 64, split outside 1..k / 64 or K2 outside 2..16."""
    if not (available() and hasattr(torch.ops.exl3_kernels, "gemm_a_whole")):
        return False
    return bool(torch.ops.exl3_kernels.gemm_a_whole(bm, lohi, k, split, max_k2))


# Per-block phase stamps of the GEMM kernels (profiling builds only: EXL3_TIMELINE=1, csrc/include/exl3/timeline.cuh).
TIMELINE_SLOTS = ("info", "entry", "waited", "loop_start", "loop_end", "partials", "exit", "unused")


def timeline_built() -> bool:
    """Whether the loaded library's GEMM kernels write phase stamps (built with ``NVCC_APPEND_FLAGS=-DEXL3_TIMELINE=1``,
    csrc/include/exl3/timeline.cuh). False without the library or for libraries before the stamps."""
    if not (available() and hasattr(torch.ops.exl3_kernels, "timeline_built")):
        return False
    return bool(torch.ops.exl3_kernels.timeline_built())


def timeline_set(buf: torch.Tensor | None) -> None:
    """Give the GEMM launches that follow per-block records in ``buf`` (int64 CUDA, contiguous, 8 x blocks elements;
    ``None`` stops). Each launch of :func:`gemm`, :func:`gemm_x` or :func:`gemm_wgmma_rs` takes the next region of
    grid-size records, fixed when the launch is issued, so the calls captured in one CUDA graph keep separate records
    on every replay; a launch that no longer fits gets none. Record of a block (slots :data:`TIMELINE_SLOTS`): [0]
    the SM id, plus 2^32 when the block finished an output tile; [1..6] %globaltimer (ns) at entry, after the wait
    for the kernel before, at the k loop's start and end, after the partial sums, at exit; blocks of an empty k slice
    of the register-A GEMM stamp only their entry. Process-wide host state (not thread-safe; a profiling aid).

    Raises RuntimeError when the library was built without the stamps or ``buf`` is not as described."""
    torch.ops.exl3_kernels.timeline_set(buf)


def timeline_used() -> int:
    """Blocks given records (8 int64 each) since the last :func:`timeline_set` (0 after ``timeline_set(None)``).

    Raises AttributeError / RuntimeError when the loaded library predates the timeline ops or is not loaded."""
    return int(torch.ops.exl3_kernels.timeline_used())


def cluster_splitk_available(device: torch.device | str) -> bool:
    """Whether split-k can be reduced inside a thread block cluster on ``device``: compute capability 9.0+ and a
    loaded library whose gemm has the ``cluster`` argument. (The op still refuses, with an error, an image of
    pre-sm_90 PTX JIT-compiled for the device.)"""
    if not available():
        return False
    dev = torch.device(device)
    return dev.type == "cuda" and torch.cuda.get_device_capability(dev)[0] >= 9 and _gemm_has_cluster_arg()


def gemm_wgmma(xh: torch.Tensor, trellis: list[torch.Tensor], svh: list[torch.Tensor], bias: torch.Tensor | None,
               codebook: int, split: int, acc: torch.Tensor, out_dtype: torch.dtype, stream_k: int = 0) -> torch.Tensor:
    """The Hopper wgmma trellis GEMM (csrc/gemm_sm90/wgmma_gemm.cu): the contract of :func:`gemm` with BM = 256.

    Needs :func:`wgmma_built` for ``codebook`` and a compute capability 9.0 device (sm_90a code); ``xh`` is the
    [S, m, k] fp16 output of :func:`input_transform` (one TMA tensor map over all shards). ``split`` > 1 reduces into
    ``acc`` (all zero before and after) and runs the split-k epilogue. PDL as in :func:`gemm` (CUDA_EXL3_PDL).
    ``stream_k`` > 0 (``split`` = 1, needs :func:`wgmma_has_stream_k`): stream-k over that many blocks (clamped to the
    work units; normally the SM count): the blocks share the (256 x 128 output tile, 64-k stage) units equally, hand
    running sums over through ``acc`` (fp32, at least 1024 + 32768 x blocks elements after clamping: 1024 int32 flags,
    zero before and after, then one slot per block, whose contents may be anything and are left as written: pass
    workspace.sk_slots, never the split-k accumulator) and write y themselves; one kernel, deterministic for a given
    ``stream_k``. Raises RuntimeError when ``acc`` is smaller, ``split`` is not 1 or ``stream_k`` > 1024.

    Raises:
        RuntimeError when the library has no wgmma GEMM for the codebook, the device is not 9.0, or on the argument
        checks of :func:`gemm`.
    """
    if stream_k:
        return torch.ops.exl3_kernels.gemm_wgmma(xh, trellis, svh, bias, codebook, split, acc, out_dtype,
                                                 env.get_bool("PDL", True), stream_k)
    return torch.ops.exl3_kernels.gemm_wgmma(xh, trellis, svh, bias, codebook, split, acc, out_dtype,
                                             env.get_bool("PDL", True))


_has_sk: bool | None = None


def wgmma_has_stream_k() -> bool:
    """Whether the loaded library's gemm_wgmma takes ``stream_k`` (libraries built before it do not); cached."""
    global _has_sk
    if _has_sk is None:
        _has_sk = bool(load() and hasattr(torch.ops.exl3_kernels, "gemm_wgmma") and any(
            a.name == "stream_k" for a in torch.ops.exl3_kernels.gemm_wgmma.default._schema.arguments))
    return _has_sk


def gemm_wgmma_rs(xh: torch.Tensor, trellis: list[torch.Tensor], svh: list[torch.Tensor], bias: torch.Tensor | None,
                  codebook: int, bm: int, split: int, acc: torch.Tensor, out_dtype: torch.dtype,
                  tile_flags: torch.Tensor | None = None, cluster: bool = False) -> torch.Tensor:
    """The register-A Hopper trellis GEMM (csrc/gemm_sm90/wgmma_rs_gemm.cu): the decoded trellis is the wgmma A
    operand from registers, ``xh`` the B operand from shared memory; BM (``bm``) = 8, 16, 32, 64 or 128 rows per block.

    Same arguments and result as :func:`gemm`, except that the kernel adds its fp32 partial sums into ``acc`` at every
    split (split 1 included) and the split-k epilogue writes y and re-zeroes ``acc``: ``acc`` must hold m * n_total
    zeros. Needs :func:`wgmma_rs_usable` (built for ``codebook``, compute capability 9.0). PDL as in :func:`gemm`.
    ``tile_flags`` (as :func:`gemm`, at every split here): the kernel writes y itself, from its own partial sums at
    split 1 (``acc`` untouched) and by the last split block of each tile at split > 1; no epilogue kernel runs.
    ``cluster`` (split 2..16; explicit only, CUDA_EXL3_CLUSTER does not apply here): the split blocks of each output
    tile form a thread block cluster and reduce through distributed shared memory inside the GEMM
    (csrc/gemm_sm90/wgmma_rs_gemm.cu, cluster_finish): ``acc`` and ``tile_flags`` are not used (any fp32 CUDA tensor
    will do for ``acc``), no epilogue kernel runs, and reruns are bit-identical. Ignored at split 1; above split 16
    (sm_90's largest cluster) the op runs the accumulator path instead, so ``acc`` must then be the real accumulator.

    Raises:
        RuntimeError when the library has no such kernel for the codebook and BM, the device is not 9.0, the
        accumulator is too small, ``cluster=True`` with a library whose op predates it (:func:`wgmma_rs_has_cluster`),
        or on the argument checks of :func:`gemm`.
        ValueError if CUDA_EXL3_PDL or CUDA_EXL3_SPREAD is not a boolean.
    """
    env.get_bool("SPREAD", True)  # read again by the library at launch (exl3/spread.h); checked and warned about here
    if cluster and split > 1:
        if not wgmma_rs_has_cluster():
            raise RuntimeError("exl3_kernels.gemm_wgmma_rs: cluster=True needs a library whose register-A GEMM has the "
                               "cluster split-k (this one predates it)")
        return torch.ops.exl3_kernels.gemm_wgmma_rs(xh, trellis, svh, bias, codebook, bm, split, acc, out_dtype,
                                                    env.get_bool("PDL", True), None, True)
    if tile_flags is not None and has_tile_flags():
        return torch.ops.exl3_kernels.gemm_wgmma_rs(xh, trellis, svh, bias, codebook, bm, split, acc, out_dtype,
                                                    env.get_bool("PDL", True), tile_flags)
    return torch.ops.exl3_kernels.gemm_wgmma_rs(xh, trellis, svh, bias, codebook, bm, split, acc, out_dtype,
                                                env.get_bool("PDL", True))


def wgmma_rs_has_cluster() -> bool:
    """Whether the loaded library's register-A GEMM takes ``cluster`` (split-k inside a thread block cluster; libraries
    before the twenty-ninth session's do not). False without the op."""
    return load() and hasattr(torch.ops.exl3_kernels, "gemm_wgmma_rs") and _op_has_arg("gemm_wgmma_rs", "cluster")


def wgmma_rs_usable(device: torch.device | str, codebook: int) -> bool:
    """The register-A GEMM can run: the library has the op (it is built with the wgmma GEMM, for the same codebooks)
    and :func:`wgmma_usable` holds."""
    return load() and hasattr(torch.ops.exl3_kernels, "gemm_wgmma_rs") and wgmma_usable(device, codebook)


_wgmma_cbs: tuple[int, ...] | None = None


def wgmma_codebooks() -> tuple[int, ...]:
    """Codebook ids with a wgmma GEMM in the loaded library: all three (or the reduced set) when the build had 9.0 in
    TORCH_CUDA_ARCH_LIST, none otherwise, or when the library is missing or predates the op."""
    global _wgmma_cbs
    if _wgmma_cbs is None:
        cbs: tuple[int, ...] = ()
        if load() and hasattr(torch.ops.exl3_kernels, "wgmma_codebooks"):
            cbs = tuple(int(c) for c in torch.ops.exl3_kernels.wgmma_codebooks())
        _wgmma_cbs = cbs
    return _wgmma_cbs


def wgmma_built(codebook: int | None = None) -> bool:
    """Whether the library holds the wgmma GEMM (for ``codebook``, or for any codebook when None)."""
    cbs = wgmma_codebooks()
    return bool(cbs) if codebook is None else codebook in cbs


def wgmma_usable(device: torch.device | str, codebook: int) -> bool:
    """The wgmma GEMM is built for ``codebook`` and ``device`` is a compute capability 9.0 CUDA device (its code is
    sm_90a: it does not run on 9.x > 0 or on 10.0 / 12.0)."""
    device = torch.device(device)
    if device.type != "cuda" or not wgmma_built(codebook):
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _cc90:  # per forward of every layer: query the capability once per device
        _cc90[index] = tuple(torch.cuda.get_device_capability(index)) == (9, 0)
    return _cc90[index]


_cc90: dict[int, bool] = {}


def output_transform(acc: torch.Tensor, svh: list[torch.Tensor], bias: torch.Tensor | None, m: int,
                     out_dtype: torch.dtype) -> torch.Tensor:
    """y = concat_s(had_n(acc[:, shard s]) * svh_s / sqrt(128)) + bias, from an fp32 accumulator; re-zeroes it.

    The split-k epilogue of :func:`gemm` as its own op, for the dense path that applies the Hadamards to the
    activations (acc = had_k(x * suh) @ Ŵ, written by cuBLAS into the split-k workspace).

    Args:
        acc: contiguous fp32, at least m * sum n_s elements, read as [m, sum n_s] row-major; the first
            m * sum n_s elements are all zero afterwards (the workspace contract of :func:`gemm`).
        svh: per shard fp16 [n_s], n_s a multiple of 128.
        bias: fp32 [sum n_s] or None.
        m: rows.
        out_dtype: torch.float16 or torch.bfloat16.
    Returns:
        [m, sum n_s] in ``out_dtype``.
    Raises:
        RuntimeError naming the tensor on dtype/shape/device/alignment mismatch.
    """
    return torch.ops.exl3_kernels.output_transform(acc, svh, bias, m, out_dtype)


def reconstruct(trellis: list[torch.Tensor], suh: list[torch.Tensor], svh: list[torch.Tensor], codebook: int,
                col_begin: int = 0, col_end: int = -1, dtype: torch.dtype = torch.float16,
                transform: bool = True, tma: bool | None = None) -> torch.Tensor:
    """Dense W[k, col_begin:col_end] = diag(suh) H Ŵ H diag(svh) (transform=True) or Ŵ (transform=False).

    Args:
        trellis, suh, svh: per shard, the int16 trellis [k/16, n_s/16, 16K], fp16 suh [k] and svh [n_s].
        codebook: 0 = 3inst, 1 = mcg, 2 = mul1.
        col_begin, col_end: absolute column range of the fused layer, multiples of 128 (col_end -1 = all columns).
        dtype: torch.float16 or torch.bfloat16 (bf16 with transforms runs csrc/reconstruct/reconstruct_bf16.cu).
        tma: None = CUDA_EXL3_RECON_TMA (read here, at every call; default on); False makes the bf16 kernel write W
            with LDS / STG instead of TMA stores (same values; for comparison). Libraries built without the argument
            ignore it.
    Returns:
        W [k, col_end - col_begin] in ``dtype``.
    Raises:
        RuntimeError naming the tensor on a dtype / shape / device / alignment mismatch, and on compute capability
        9.0+ with ``tma`` on if the driver cannot encode W's tensor map (set CUDA_EXL3_RECON_TMA=0 to avoid it).
    """
    if _reconstruct_has_tma_arg():
        return torch.ops.exl3_kernels.reconstruct(trellis, suh, svh, codebook, col_begin, col_end, dtype, transform,
                                                  _recon_tma(tma))
    return torch.ops.exl3_kernels.reconstruct(trellis, suh, svh, codebook, col_begin, col_end, dtype, transform)


def reconstruct_out(out: torch.Tensor, trellis: list[torch.Tensor], suh: list[torch.Tensor], svh: list[torch.Tensor],
                    codebook: int, col_begin: int, col_end: int, transform: bool = True,
                    tma: bool | None = None) -> None:
    """:func:`reconstruct` into a caller-owned ``out``.

    Args:
        out: contiguous [k, col_end - col_begin], fp16 or bf16 (its dtype is W's), on the trellis' device; a 16-byte
            aligned bf16 ``out`` with ``transform`` takes reconstruct_bf16.cu, otherwise reconstruct.cu.
        The rest as :func:`reconstruct` (col_end must be given here).
    Raises:
        RuntimeError as :func:`reconstruct`, and when ``out`` has the wrong shape, dtype, device or layout.
    """
    if _reconstruct_has_tma_arg():
        torch.ops.exl3_kernels.reconstruct_out(out, trellis, suh, svh, codebook, col_begin, col_end, transform,
                                               _recon_tma(tma))
    else:
        torch.ops.exl3_kernels.reconstruct_out(out, trellis, suh, svh, codebook, col_begin, col_end, transform)


def _recon_tma(tma: bool | None) -> bool:
    return env.get_bool("RECON_TMA", True) if tma is None else bool(tma)


def _reconstruct_has_tma_arg() -> bool:
    """Whether the loaded library's reconstruct ops take ``tma`` (libraries before it do not)."""
    return _op_has_arg("reconstruct", "tma")


def reconstruct_t(trellis: list[torch.Tensor], svh: list[torch.Tensor], codebook: int, col_begin: int = 0,
                  col_end: int = -1) -> torch.Tensor:
    """Ŵ^T[col_begin:col_end] = the decoded trellis without transforms, transposed: fp16 [col_end - col_begin, k].

    The operand of the reconstruct_act path (``torch.ops.exl3_kernels.reconstruct_t_out`` writes into a
    workspace). Bit-identical to ``reconstruct(..., transform=False).t()`` (GPU test). Columns are absolute in
    the fused layer and must be 128-aligned; ``svh`` only validates the shard shapes.

    Raises:
        RuntimeError naming the tensor on shape/dtype/device/alignment mismatch.
    """
    n_total = sum(t.shape[1] * 16 for t in trellis)
    end = n_total if col_end < 0 else col_end
    out = torch.empty(end - col_begin, trellis[0].shape[0] * 16, dtype=torch.float16, device=trellis[0].device)
    torch.ops.exl3_kernels.reconstruct_t_out(out, trellis, svh, codebook, col_begin, end)
    return out


def reconstruct_n(trellis: list[torch.Tensor], svh: list[torch.Tensor], codebook: int, col_begin: int = 0,
                  col_end: int = -1, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """W_n[:, col_begin:col_end] = Ŵ H_n diag(svh) / sqrt(128): the output transform folded into the weight.

    [k, col_end - col_begin] in ``dtype`` (fp16 or bf16; fp32 inside, one rounding). With
    xh = :func:`input_transform` (x, suh), ``xh @ W_n`` is the layer (per shard; docs/kernels.md,
    reconstruct_n). Columns are absolute in the fused layer and must be 128-aligned.

    Raises:
        RuntimeError naming the tensor on shape/dtype/device/alignment mismatch.
    """
    n_total = sum(t.shape[1] * 16 for t in trellis)
    end = n_total if col_end < 0 else col_end
    out = torch.empty(trellis[0].shape[0] * 16, end - col_begin, dtype=dtype, device=trellis[0].device)
    torch.ops.exl3_kernels.reconstruct_n_out(out, trellis, svh, codebook, col_begin, end)
    return out


def reconstruct_n_out(out: torch.Tensor, trellis: list[torch.Tensor], svh: list[torch.Tensor], codebook: int,
                      col_begin: int, col_end: int, pdl: bool = False) -> None:
    """Write W_n[:, col_begin:col_end] (see :func:`reconstruct_n`) into ``out`` ([k, col_end - col_begin], fp16/bf16).

    ``pdl`` (sm_90+, and CUDA_EXL3_PDL not 0): programmatic dependent launch, so the kernel may start while the kernel
    before it on the stream still runs; it waits for that kernel at its end (csrc/reconstruct/reconstruct_n.cu).
    Only for a caller that knows its predecessor neither writes the weights nor reads ``out`` and that the kernel
    before the predecessor cannot still be reading ``out``: the reconstruct_n path's first chunk, right after its
    own input transform, which lets it launch only after its own wait for the kernel before it (a plain launch, or
    PDL without ``early``: :func:`input_transform`, linear.py). Libraries built before the argument ignore it.

    Raises:
        RuntimeError naming the tensor on shape/dtype/device/alignment mismatch.
    """
    if pdl and env.get_bool("PDL", True) and _reconstruct_n_has_pdl_arg():
        torch.ops.exl3_kernels.reconstruct_n_out(out, trellis, svh, codebook, col_begin, col_end, True)
    else:
        torch.ops.exl3_kernels.reconstruct_n_out(out, trellis, svh, codebook, col_begin, col_end)


_rn_pdl_arg: bool | None = None


def _reconstruct_n_has_pdl_arg() -> bool:
    """Whether the loaded library's reconstruct_n_out schema has the ``pdl`` argument (read once: the library does
    not change)."""
    global _rn_pdl_arg
    if _rn_pdl_arg is None:
        _rn_pdl_arg = any(a.name == "pdl" for a in torch.ops.exl3_kernels.reconstruct_n_out.default._schema.arguments)
    return _rn_pdl_arg


def decode_lut(codebook: int, device: torch.device | str = "cuda") -> torch.Tensor:
    """fp16 [65536]: the device decoder applied to every 16-bit state (test hook)."""
    out = torch.empty(65536, dtype=torch.float16, device=device)
    torch.ops.exl3_kernels.decode_lut(out, codebook)
    return out


_built: list[tuple[bool, int, int]] | None = None


def built_instances(lohi: bool = False) -> list[tuple[int, int]]:
    """(codebook id, BM) pairs of the GEMM instances compiled into the library, plain or (``lohi``) of the lohi
    variant (queried once: the library does not change). The op encodes lohi * 100000 + codebook * 1000 + BM."""
    global _built
    if _built is None:
        _built = [(v >= 100000, (v % 100000) // 1000, v % 1000) for v in torch.ops.exl3_kernels.built_instances()]
    return [(cb, bm) for lh, cb, bm in _built if lh == lohi]


def compiled_k2() -> list[int]:
    """K2 = 2K values compiled into the library."""
    mask = torch.ops.exl3_kernels.compiled_k2_mask()
    return [k2 for k2 in range(2, 17) if (mask >> k2) & 1]

