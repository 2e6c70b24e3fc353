"""Synthetic EXL3 checkpoints for the exl3-format tests, written with ``safetensors.numpy.save_file``.

(A uniquely named module rather than conftest.py, so tests can import it under pytest's importlib import mode.)

Tensor contents do not matter to a header-only reader, so trellises are zeros; what matters are names, dtypes,
shapes and the marker values (the int32 reinterpretation of the locked uint32 multipliers).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

REPO = Path(__file__).resolve().parents[3]
ORACLE_DIR = REPO.parent / "shared" / "oracle"
TINY_LLAMA = REPO.parent / "shared" / "models" / "tiny-llama-pydocs"

MCG_I32 = -877912083  # 0xCBAC1FED as int32 (docs/exl3-format.md §1.4)
MUL1_I32 = -2082680531  # 0x83DCD12D as int32
MARKER_I32 = {"mcg": MCG_I32, "mul1": MUL1_I32}


def marker(value: int) -> np.ndarray:
    """0-dim int32 marker tensor."""
    return np.array(value, dtype=np.int32)


class CheckpointBuilder:
    """Collects tensors and JSON files, then writes a checkpoint directory."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.tensors: dict[str, np.ndarray] = {}
        self.config: dict | None = None
        self.hint: dict | None = None

    def linear(
        self,
        key: str,
        k: int,
        n: int,
        K: float = 4,
        codebook: str = "mul1",
        *,
        bias: str | None = None,
        legacy: bool = False,
        marker_value: int | None = None,
        skip: tuple[str, ...] = (),
    ) -> CheckpointBuilder:
        """Add an EXL3 linear: trellis I16 [k/16, n/16, 16K], suh/svh F16 (or su/sv I16), optional bias, marker."""
        parts = {"trellis": np.zeros((k // 16, n // 16, int(16 * K)), np.int16)}
        if legacy:
            parts["su"] = np.zeros(k // 16, np.int16)
            parts["sv"] = np.zeros(n // 16, np.int16)
        else:
            parts["suh"] = np.ones(k, np.float16)
            parts["svh"] = np.ones(n, np.float16)
        if bias is not None:
            parts["bias"] = np.zeros(n, {"F16": np.float16, "F32": np.float32}[bias])
        if codebook != "3inst":
            parts[codebook] = marker(MARKER_I32[codebook] if marker_value is None else marker_value)
        for suffix, array in parts.items():
            if suffix not in skip:
                self.tensors[f"{key}.{suffix}"] = array
        return self

    def tensor(self, name: str, array: np.ndarray) -> CheckpointBuilder:
        self.tensors[name] = np.ascontiguousarray(array)
        return self

    def write(self, shards: int = 1, index: bool = True) -> Path:
        """Write ``model.safetensors`` (shards=1) or ``model-0000i-of-0000N.safetensors`` + index (round robin by
        module so that a module's tensors stay together), config.json and quantization_config.json."""
        self.root.mkdir(parents=True, exist_ok=True)
        if shards == 1:
            save_file(self.tensors, str(self.root / "model.safetensors"))
        else:
            modules = list(dict.fromkeys(name.rpartition(".")[0] for name in self.tensors))
            owner = {module: i % shards for i, module in enumerate(modules)}
            weight_map = {}
            for i in range(shards):
                fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
                part = {n: a for n, a in self.tensors.items() if owner[n.rpartition(".")[0]] == i}
                save_file(part, str(self.root / fname))
                weight_map.update({n: fname for n in part})
            if index:
                (self.root / "model.safetensors.index.json").write_text(
                    json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map})
                )
        if self.config is not None:
            (self.root / "config.json").write_text(json.dumps(self.config))
        if self.hint is not None:
            (self.root / "quantization_config.json").write_text(json.dumps(self.hint))
        return self.root


def write_raw(path: Path, header: dict | bytes, data: bytes = b"", length: int | None = None) -> Path:
    """Write a safetensors-like file with an arbitrary header (dict -> JSON) and data; ``length`` overrides the
    8-byte header length prefix."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


# --- A Qwen3-MoE-like checkpoint with mixed K and an MTP module -----------------------------------------------
QWEN3_MOE_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 512,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 1024,
    "moe_intermediate_size": 256,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 2,
    "vocab_size": 1000,
    "mtp_num_hidden_layers": 1,
    "tie_word_embeddings": False,
}
# Per decoder layer: q=4, k=5, v=5, o=4 (mixed K as in real checkpoints); experts 3 bpw in layer 0 and 2.5 in
# layer 1 (half rate, mul1). lm_head 6 bpw over a 1000 -> 1024 padded vocab. MTP: fc + one layer at 4/3 bpw.
QWEN3_MOE_ATTN_K = {"q_proj": 4, "k_proj": 5, "v_proj": 5, "o_proj": 4}
QWEN3_MOE_EXPERT_K = {0: 3, 1: 2.5}


def _attn_dims(proj: str) -> tuple[int, int]:
    return {"q_proj": (512, 512), "k_proj": (512, 128), "v_proj": (512, 128), "o_proj": (512, 512)}[proj]


def build_qwen3_moe(root: Path, shards: int = 2, hint_mismatch: bool = True) -> Path:
    """Write the Qwen3-MoE-like checkpoint; returns its directory."""
    b = CheckpointBuilder(root)
    b.tensor("model.embed_tokens.weight", np.zeros((1000, 512), np.float16))
    b.tensor("model.norm.weight", np.ones(512, np.float16))
    for layer in (0, 1):
        p = f"model.layers.{layer}"
        b.tensor(f"{p}.input_layernorm.weight", np.ones(512, np.float16))
        b.tensor(f"{p}.post_attention_layernorm.weight", np.ones(512, np.float16))
        b.tensor(f"{p}.self_attn.q_norm.weight", np.ones(64, np.float16))
        b.tensor(f"{p}.self_attn.k_norm.weight", np.ones(64, np.float16))
        for proj, K in QWEN3_MOE_ATTN_K.items():
            b.linear(f"{p}.self_attn.{proj}", *_attn_dims(proj), K=K)
        b.tensor(f"{p}.mlp.gate.weight", np.zeros((4, 512), np.float16))
        for e in range(4):
            for proj, (k, n) in (("gate_proj", (512, 256)), ("up_proj", (512, 256)), ("down_proj", (256, 512))):
                b.linear(f"{p}.mlp.experts.{e}.{proj}", k, n, K=QWEN3_MOE_EXPERT_K[layer])
    b.linear("lm_head", 512, 1024, K=6)
    # Qwen3-Next-style MTP module
    b.tensor("mtp.pre_fc_norm_embedding.weight", np.ones(512, np.float16))
    b.linear("mtp.fc", 1024, 512, K=4)
    for proj in QWEN3_MOE_ATTN_K:
        b.linear(f"mtp.layers.0.self_attn.{proj}", *_attn_dims(proj), K=4)
    for e in range(4):
        for proj, (k, n) in (("gate_proj", (512, 256)), ("up_proj", (512, 256)), ("down_proj", (256, 512))):
            b.linear(f"mtp.layers.0.mlp.experts.{e}.{proj}", k, n, K=3)
    b.config = dict(QWEN3_MOE_CONFIG)
    b.config["quantization_config"] = {
        "quant_method": "exl3",
        "version": "1.6.5",
        "bits": 3.18,
        "head_bits": 6,
        "calibration": {"rows": 250, "cols": 2048},
        "out_scales": "auto",
        "codebook": "mul1",
    }
    storage = {}
    for name, array in b.tensors.items():
        key = name.rpartition(".")[0]
        entry = storage.setdefault(key, {"stored_tensors": {}})
        entry["stored_tensors"][name] = {
            "shape": list(array.shape),
            "n_bytes": int(array.nbytes),
            "dtype": {
                np.dtype(np.int16): "torch.int16",
                np.dtype(np.float16): "torch.float16",
                np.dtype(np.int32): "torch.int32",
            }[array.dtype],
        }
        if name.endswith(".trellis"):
            K = array.shape[-1] / 16
            entry.update(
                quant_format="exl3", bits_per_weight=int(K) if K.is_integer() else K, mul1_multiplier=0x83DCD12D
            )
    if hint_mismatch:
        storage["model.layers.0.self_attn.k_proj"]["bits_per_weight"] = 4  # headers say 5
    b.hint = dict(b.config["quantization_config"], tensor_storage=storage)
    return b.write(shards=shards)
