"""Write a complete EXL3 checkpoint directory for an HF decoder config.

Layout (docs/exl3-format.md 1.1-1.4, after exllamav3 1.6.5 ``conversion/compile.py`` and
``conversion/quant_config.py``): ``config.json`` (the HF config with ``quantization_config`` and
``tie_word_embeddings: false``), ``quantization_config.json`` (the same dict plus ``tensor_storage`` per leaf
module), ``model.safetensors`` or ``model-0000i-of-0000N.safetensors`` + ``model.safetensors.index.json``, and
the tokenizer/auxiliary files of a source directory.

The whole checkpoint is planned first (every tensor's name, shape and dtype), so shard boundaries and the index
are known before any data is produced; tensors are then generated and written one shard at a time (memory is
bounded by one shard, never the model).
"""

from __future__ import annotations

import fnmatch
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..reference.codebook import MCG_MULTIPLIER, MUL1_MULTIPLIER, normalize_codebook
from ..reference.trellis import check_k, is_half_rate
from .arch import DenseSpec, LinearSpec, architecture_of, modules_in_order
from .quantize import (
    QuantizedLinear,
    encode_linear,
    fast_random_uniform,
    make_generator,
    random_linear,
    round_up,
    stored_tensor_meta,
)

WEIGHT_MODES = ("random", "encode", "headers-only")
DEFAULT_SHARD_BYTES = 2 * 1024**3
#: Files never copied from a source directory (weights and the files this writer produces).
_SKIP_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack", ".onnx")
_SKIP_NAMES = {"config.json", "quantization_config.json", "model.safetensors.index.json",
               "pytorch_model.bin.index.json"}
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_ST_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64}


def writer_version() -> str:
    """Version stamp written as ``quantization_config.version``: the exl3-kernels package version."""
    try:
        from importlib.metadata import version

        return version("exl3-kernels")
    except Exception:  # not installed (PYTHONPATH checkout)
        return "0.1.0"


def _gain(key: str) -> float:
    """Output gain of a synthetic linear: residual-writing projections smaller, lm_head larger."""
    if key.endswith(("o_proj", "down_proj")):
        return 0.5
    if key == "lm_head":
        return 2.0
    return 1.0


def resolve_glob(key: str, default, overrides: dict | None):
    """Value for ``key``: the last glob in ``overrides`` (insertion order) matching it, else ``default``."""
    value = default
    for pattern, v in (overrides or {}).items():
        if fnmatch.fnmatchcase(key, pattern):
            value = v
    return value


@dataclass
class PlannedLinear:
    spec: LinearSpec
    K: float
    codebook: str
    k: int
    n: int
    meta: dict[str, tuple]

    @property
    def module(self) -> str:
        return self.spec.key


@dataclass
class PlannedDense:
    spec: DenseSpec
    dtype: torch.dtype
    meta: dict[str, tuple] = field(default_factory=dict)

    @property
    def module(self) -> str:
        return self.spec.module


@dataclass
class Plan:
    """Everything decided before writing: modules in order, per-linear K/codebook/stored dims, shards."""

    hf_config: dict
    items: list[PlannedLinear | PlannedDense]
    shards: list[list[int]]  # item indices per shard
    head_bits: float

    def tensor_meta(self) -> dict[str, tuple]:
        out: dict[str, tuple] = {}
        for it in self.items:
            out.update(it.meta)
        return out

    def linears(self) -> list[PlannedLinear]:
        """The planned EXL3 linears, in write order."""
        return [it for it in self.items if isinstance(it, PlannedLinear)]


def _nbytes(shape: tuple, dtype: torch.dtype) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n * torch.empty((), dtype=dtype).element_size()


def _item_bytes(item) -> int:
    return sum(_nbytes(s, d) for s, d in item.meta.values())


class _Source:
    """Dense HF checkpoint reader (safetensors files of a directory, opened lazily by tensor name)."""

    def __init__(self, source_dir: Path):
        self.dir = source_dir
        self.where: dict[str, Path] = {}
        files = sorted(source_dir.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors files in source directory {source_dir}")
        for f in files:
            with safe_open(str(f), framework="pt") as h:
                for name in h.keys():
                    self.where[name] = f

    def has(self, name: str) -> bool:
        return name in self.where

    def dtype(self, name: str) -> torch.dtype:
        with safe_open(str(self.where[name]), framework="pt") as h:
            st = h.get_slice(name).get_dtype()
        if st not in _ST_DTYPES:
            raise ValueError(f"tensor {name!r} in {self.where[name]} has unsupported dtype {st}")
        return _ST_DTYPES[st]

    def get(self, name: str, shape: tuple | None = None, needed_for: str = "") -> torch.Tensor:
        if name not in self.where:
            raise KeyError(f"source checkpoint {self.dir} has no tensor {name!r} (needed for {needed_for or name})")
        with safe_open(str(self.where[name]), framework="pt") as h:
            t = h.get_tensor(name)
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise ValueError(
                f"tensor {name!r} in {self.where[name]} has shape {tuple(t.shape)}, expected {tuple(shape)}"
            )
        return t


def plan_checkpoint(
    hf_config: dict,
    *,
    default_bits: float = 4.0,
    overrides: dict | None = None,
    codebook="mcg",
    codebook_overrides: dict | None = None,
    head_bits: float = 6.0,
    pad_to_128: bool = True,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    dense_dtype: Callable[[DenseSpec], torch.dtype] | None = None,
) -> Plan:
    """Decide every stored tensor (names, shapes, dtypes, K, codebook, padding) and the shard split.

    Raises:
        ValueError: unsupported architecture, invalid K, a half-rate K without the mul1 codebook, or (with
        ``pad_to_128=False``) a dim that is not a multiple of 128, naming the module.
    """
    architecture_of(hf_config)
    head_bits = float(head_bits)
    head_quantized = head_bits != 16.0
    if head_quantized:
        check_k(head_bits)
    default_cb = normalize_codebook(codebook)
    cfg_dtype = _DTYPES.get(str(hf_config.get("torch_dtype") or hf_config.get("dtype") or "bfloat16"), torch.bfloat16)
    items: list[PlannedLinear | PlannedDense] = []
    for spec in modules_in_order(hf_config, head_quantized):
        if isinstance(spec, DenseSpec):
            if spec.role == "lm_head":
                dt = torch.float16  # unquantized Linear: fp16 (out, in) as exllamav3's fp16 quant module writes it
            elif dense_dtype is not None:
                dt = dense_dtype(spec)
            elif spec.role == "router_bias":
                dt = torch.float32  # DeepSeek-V3 keeps e_score_correction_bias in fp32
            else:
                dt = cfg_dtype
            items.append(PlannedDense(spec, dt, {spec.name: (spec.shape, dt)}))
            continue
        if spec.key == "lm_head":
            K = head_bits
        else:
            K = check_k(resolve_glob(spec.key, default_bits, overrides))
        cb = normalize_codebook(resolve_glob(spec.key, default_cb, codebook_overrides))
        if is_half_rate(K) and cb != "mul1":
            raise ValueError(f"{spec.key}: K={K} is a half rate, which requires the mul1 codebook (got {cb!r})")
        if pad_to_128:
            k, n = round_up(spec.in_features, 128), round_up(spec.out_features, 128)
        else:
            k, n = spec.in_features, spec.out_features
            if k % 128 or n % 128:
                raise ValueError(
                    f"{spec.key}: in={k}, out={n}: EXL3 needs both to be multiples of 128 (use pad_to_128=True)"
                )
        items.append(PlannedLinear(spec, K, cb, k, n, stored_tensor_meta(spec, K, cb, k, n)))
    shards: list[list[int]] = [[]]
    size = 0
    for i, it in enumerate(items):
        b = _item_bytes(it)
        if shards[-1] and size + b > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(i)
        size += b
    return Plan(hf_config, items, shards, head_bits)


def plan_bytes(plan: Plan) -> int:
    """Total bytes of all planned tensors (the sum of the shards' data)."""
    return sum(_item_bytes(it) for it in plan.items)


def _check_source(plan: Plan, source: _Source) -> None:
    """Fail before writing anything if a source tensor is missing or has the wrong shape (names both)."""
    for it in plan.items:
        if isinstance(it, PlannedDense):
            name, shape = it.spec.name, it.spec.shape
            if it.spec.role == "lm_head" and not source.has(name):
                name = "model.embed_tokens.weight"
            needed = [(name, shape)]
        else:
            spec = it.spec
            wname = f"{spec.key}.weight"
            if spec.key == "lm_head" and not source.has(wname):
                wname = "model.embed_tokens.weight"
            needed = [(wname, (spec.out_features, spec.in_features))]
            if spec.bias:
                needed.append((f"{spec.key}.bias", (spec.out_features,)))
        for name, shape in needed:
            if not source.has(name):
                raise KeyError(f"source checkpoint {source.dir} has no tensor {name!r} (needed for {it.module})")
            with safe_open(str(source.where[name]), framework="pt") as h:
                found = tuple(h.get_slice(name).get_shape())
            if found != tuple(shape):
                raise ValueError(f"tensor {name!r} in {source.where[name]} has shape {found}, expected {tuple(shape)}")


def achieved_bits(plan: Plan) -> float:
    """Average K over the decoder layers' linears, weighted by stored weights (k*n), rounded to 2 decimals."""
    num = den = 0.0
    for it in plan.linears():
        if it.spec.key == "lm_head":
            continue
        num += it.K * it.k * it.n
        den += it.k * it.n
    return round(num / den, 2) if den else 0.0


def _bpw_json(K: float):
    return int(K) if float(K).is_integer() else float(K)


def quantization_config(plan: Plan, codebook: str, weights: str, seed: int) -> dict:
    """The ``quantization_config`` dict of config.json (docs/exl3-format.md 1.2)."""
    return {
        "quant_method": "exl3",
        "version": writer_version(),
        "bits": achieved_bits(plan),
        "head_bits": _bpw_json(plan.head_bits),
        "calibration": {"rows": 0, "cols": 0},
        "out_scales": "always",
        "codebook": normalize_codebook(codebook),
        "writer": {"tool": "exl3_kernels.writer", "weights": weights, "seed": seed},
    }


def checkpoint_config(plan: Plan, codebook, weights: str, seed: int) -> dict:
    """The config.json dict: the HF config, ``tie_word_embeddings: false`` and ``quantization_config``."""
    config = dict(plan.hf_config)
    config["tie_word_embeddings"] = False
    config["quantization_config"] = quantization_config(plan, codebook, weights, seed)
    return config


def tensor_storage(plan: Plan) -> dict:
    """``tensor_storage`` per leaf module (docs/exl3-format.md 1.3; exllamav3 ``conversion/quant_config.py``)."""
    out: dict[str, dict] = {}
    for it in plan.items:
        entry = out.setdefault(it.module, {"stored_tensors": {}})
        for name, (shape, dtype) in it.meta.items():
            entry["stored_tensors"][name] = {"shape": list(shape), "n_bytes": _nbytes(shape, dtype),
                                             "dtype": str(dtype)}
        if isinstance(it, PlannedLinear):
            entry["quant_format"] = "exl3"
            entry["bits_per_weight"] = _bpw_json(it.K)
            if it.codebook == "mcg":
                entry["mcg_multiplier"] = MCG_MULTIPLIER
            elif it.codebook == "mul1":
                entry["mul1_multiplier"] = MUL1_MULTIPLIER
    return out


def _dense_std(spec: DenseSpec) -> float:
    return {"embed": 0.5, "router": 1.0 / spec.shape[-1] ** 0.5, "router_bias": 0.01,
            "lm_head": 2.0 / spec.shape[-1] ** 0.5}.get(spec.role, 0.02)


def _random_dense(spec: DenseSpec, dtype: torch.dtype, seed: int, fast: bool = False) -> torch.Tensor:
    """Synthetic unquantized tensor: norms ~ 1 + N(0, 0.02); embeddings std 0.5; routers std 1/sqrt(hidden);
    fp16 lm_head std 2/sqrt(hidden). ``fast`` (headers-only mode) draws uniform values of the same std in bulk."""
    if fast:
        t = fast_random_uniform(seed, "dense:" + spec.name, spec.shape, _dense_std(spec), dtype)
        return t + 1 if spec.role == "norm" else t
    g = make_generator(seed, "dense:" + spec.name)
    if spec.role == "norm":
        t = 1.0 + 0.02 * torch.randn(spec.shape, generator=g)
    elif spec.role == "embed":
        t = 0.5 * torch.randn(spec.shape, generator=g)
    elif spec.role == "router":
        t = torch.randn(spec.shape, generator=g) / spec.shape[1] ** 0.5
    elif spec.role == "router_bias":
        t = 0.01 * torch.randn(spec.shape, generator=g)
    elif spec.role == "lm_head":
        t = torch.randn(spec.shape, generator=g) * (2.0 / spec.shape[1] ** 0.5)
    else:  # pragma: no cover - every role is listed above
        raise ValueError(f"no synthetic rule for role {spec.role!r} ({spec.name})")
    return t.to(dtype)


def _copy_aux_files(source_dir: Path, out_dir: Path) -> list[str]:
    copied = []
    for f in sorted(source_dir.iterdir()):
        if not f.is_file() or f.name in _SKIP_NAMES or f.name.endswith(_SKIP_SUFFIXES):
            continue
        shutil.copy2(f, out_dir / f.name)
        copied.append(f.name)
    return copied


def write_checkpoint(
    out_dir,
    hf_config: dict,
    *,
    default_bits: float = 4.0,
    overrides: dict | None = None,
    codebook="mcg",
    codebook_overrides: dict | None = None,
    head_bits: float = 6.0,
    pad_to_128: bool = True,
    source_dir=None,
    weights: str = "random",
    seed: int = 0,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    device="cpu",
    on_linear: Callable[[QuantizedLinear], None] | None = None,
) -> Path:
    """Write an EXL3 checkpoint directory for ``hf_config``; returns its path.

    Args:
        out_dir: output directory (created; existing files of the same names are overwritten).
        hf_config: HF config dict of a supported architecture (Llama, Qwen2, Qwen3, Qwen3-MoE, DeepSeek-V3).
        default_bits: K of every decoder linear unless an ``overrides`` glob (fnmatch on the module key, e.g.
            ``"*.k_proj"``; the last matching glob wins) sets another. Valid K: 1..8, 1.5/2.5/3.5 (mul1 only).
        codebook / codebook_overrides: default codebook and per-module globs ("3inst", "mcg", "mul1").
        head_bits: K of ``lm_head``; 16 stores it unquantized as fp16 ``lm_head.weight`` [vocab, hidden].
        pad_to_128: store in/out dims rounded up to multiples of 128 as exllamav3 does (padded input rows meet
            zero activations; padded output columns are noise and must be trimmed by readers).
        source_dir: copy its tokenizer/auxiliary files; with ``weights="encode"`` also read the dense weights
            (HF names, ``[out, in]``) and unquantized tensors (kept in their source dtype) from it.
        weights: ``"random"`` (random chunks -> ring-consistent states -> pack; realistic suh/svh),
            ``"encode"`` (greedy encoding of the source weights, see :func:`~.quantize.encode_linear`) or
            ``"headers-only"`` (random trellis words and realistic scales generated in bulk, no decoded weights
            computed: the fast mode for large models).
        seed: all random draws derive from (seed, tensor name).
        shard_bytes: shard size limit in bytes (a module never straddles shards).
        device: torch device for the encoder's work (``"encode"`` mode).
        on_linear: called with every :class:`~.quantize.QuantizedLinear` right before it is written (its
            ``w_hat`` is the decoded weight the trellis was built to hold; None in headers-only mode).

    Raises:
        ValueError: invalid arguments (see :func:`plan_checkpoint`), unknown ``weights`` mode, ``encode``
        without ``source_dir``. KeyError/ValueError: a source tensor missing or of the wrong shape (named).
    """
    if weights not in WEIGHT_MODES:
        raise ValueError(f"weights must be one of {WEIGHT_MODES}, got {weights!r}")
    if weights == "encode" and source_dir is None:
        raise ValueError("weights='encode' needs source_dir (a dense HF checkpoint)")
    src_path = Path(source_dir) if source_dir is not None else None
    source = _Source(src_path) if weights == "encode" else None

    def dense_dtype(spec: DenseSpec) -> torch.dtype:
        if source is not None and source.has(spec.name):
            return source.dtype(spec.name)
        if spec.role == "router_bias":
            return torch.float32
        return _DTYPES.get(str(hf_config.get("torch_dtype") or hf_config.get("dtype") or "bfloat16"), torch.bfloat16)

    plan = plan_checkpoint(
        hf_config, default_bits=default_bits, overrides=overrides, codebook=codebook,
        codebook_overrides=codebook_overrides, head_bits=head_bits, pad_to_128=pad_to_128,
        shard_bytes=shard_bytes, dense_dtype=dense_dtype if source is not None else None,
    )
    if source is not None:
        _check_source(plan, source)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    n_shards = len(plan.shards)
    names = ["model.safetensors"] if n_shards == 1 else [
        f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors" for i in range(n_shards)
    ]
    weight_map: dict[str, str] = {}
    total = 0
    for shard_idx, members in enumerate(plan.shards):
        tensors: dict[str, torch.Tensor] = {}
        for i in members:
            it = plan.items[i]
            produced = _produce(it, weights, seed, source, device, hf_config, on_linear)
            if set(produced) != set(it.meta):
                raise RuntimeError(f"internal: {it.module} produced {sorted(produced)}, planned {sorted(it.meta)}")
            for name, t in produced.items():
                shape, dtype = it.meta[name]
                if tuple(t.shape) != tuple(shape) or t.dtype != dtype:
                    raise RuntimeError(f"internal: {name} is {tuple(t.shape)} {t.dtype}, planned {shape} {dtype}")
                tensors[name] = t.contiguous()
                weight_map[name] = names[shard_idx]
                total += t.numel() * t.element_size()
        save_file(tensors, str(out / names[shard_idx]), metadata={"format": "pt"})
        del tensors
    if n_shards > 1:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    if src_path is not None:
        _copy_aux_files(src_path, out)
    config = checkpoint_config(plan, codebook, weights, seed)
    qc = config["quantization_config"]
    (out / "quantization_config.json").write_text(json.dumps({**qc, "tensor_storage": tensor_storage(plan)},
                                                             indent=2))
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def _produce(it, weights: str, seed: int, source: _Source | None, device, hf_config: dict,
             on_linear) -> dict[str, torch.Tensor]:
    if isinstance(it, PlannedDense):
        spec = it.spec
        if source is not None:
            name = spec.name
            if spec.role == "lm_head" and not source.has(name):
                name = "model.embed_tokens.weight"  # tied source
            return {spec.name: source.get(name, spec.shape, needed_for=spec.name).to(it.dtype)}
        return {spec.name: _random_dense(spec, it.dtype, seed, fast=(weights == "headers-only"))}
    spec = it.spec
    if weights == "encode":
        wname = f"{spec.key}.weight"
        if spec.key == "lm_head" and not source.has(wname):
            wname = "model.embed_tokens.weight"  # tied source: the head is the embedding
        w = source.get(wname, (spec.out_features, spec.in_features), needed_for=spec.key)
        b = source.get(f"{spec.key}.bias", (spec.out_features,), needed_for=spec.key) if spec.bias else None
        q = encode_linear(spec, w, b, it.K, it.codebook, it.k, it.n, seed, device)
    else:
        q = random_linear(spec, it.K, it.codebook, it.k, it.n, seed, _gain(spec.key),
                          with_w_hat=(weights == "random"))
    if on_linear is not None:
        on_linear(q)
    return q.tensors()


__all__ = [
    "DEFAULT_SHARD_BYTES",
    "WEIGHT_MODES",
    "Plan",
    "PlannedDense",
    "PlannedLinear",
    "achieved_bits",
    "checkpoint_config",
    "plan_bytes",
    "plan_checkpoint",
    "quantization_config",
    "resolve_glob",
    "tensor_storage",
    "write_checkpoint",
    "writer_version",
]
