"""Per-architecture tensor lists of an HF decoder model: which linears get quantized, which tensors stay dense.

Names and shapes follow the HF checkpoints of each architecture (``transformers`` 5.x ``save_pretrained``
output, which the tests compare against): Llama, Qwen2 (q/k/v bias), Qwen3 (q_norm/k_norm), Qwen3-MoE
(per-expert linears, router ``mlp.gate``), DeepSeek-V3 (MLA with q/kv LoRA projections, MoE with shared experts
and ``e_score_correction_bias``).

EXL3 storage rules applied on top (docs/exl3-format.md 1.6-1.7, exllamav3 1.6.5 ``modules/linear.py``,
``modules/block_sparse_mlp.py``): every linear is stored per projection (no fused q/k/v or gate/up), MoE experts
are never stacked, routers and norms stay unquantized with their HF names.
"""

from __future__ import annotations

from dataclasses import dataclass

ARCHITECTURES = (
    "LlamaForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "DeepseekV3ForCausalLM",
)

_MODEL_TYPE_TO_ARCH = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
}


@dataclass(frozen=True)
class LinearSpec:
    """One linear to be stored as EXL3.

    Attributes:
        key: module key, e.g. ``model.layers.3.self_attn.q_proj`` (tensors are ``<key>.trellis`` etc.).
        in_features, out_features: HF (unpadded) dims; HF weight is ``[out_features, in_features]``.
        bias: whether the HF module has a bias.
        group: Hessian-group id: linears reading the same input share the sign pattern of suh
            (q/k/v; gate/up of a dense MLP; gate/up of all experts and shared experts of one MoE layer).
        layer: decoder layer index, or None for ``lm_head``.
    """

    key: str
    in_features: int
    out_features: int
    bias: bool
    group: str
    layer: int | None


@dataclass(frozen=True)
class DenseSpec:
    """One tensor stored unquantized under its HF name.

    Attributes:
        name: tensor name. shape: HF shape. role: "embed", "norm", "router", "router_bias" or "lm_head".
        module: leaf module key (name without its last component) for ``tensor_storage``.
    """

    name: str
    shape: tuple[int, ...]
    role: str

    @property
    def module(self) -> str:
        return self.name.rsplit(".", 1)[0]


def architecture_of(hf_config: dict) -> str:
    """The supported architecture name of an HF config dict (from ``architectures`` or ``model_type``).

    Raises ValueError naming the supported architectures otherwise.
    """
    archs = hf_config.get("architectures") or []
    for a in archs:
        if a in ARCHITECTURES:
            return a
    mt = hf_config.get("model_type")
    if mt in _MODEL_TYPE_TO_ARCH:
        return _MODEL_TYPE_TO_ARCH[mt]
    raise ValueError(
        f"unsupported architecture: architectures={archs!r}, model_type={mt!r}; expected one of {ARCHITECTURES}"
    )


def _req(cfg: dict, key: str):
    if key not in cfg or cfg[key] is None:
        raise ValueError(f"HF config is missing required field {key!r}")
    return cfg[key]


def _attn_dims(cfg: dict) -> tuple[int, int, int]:
    h = _req(cfg, "hidden_size")
    n_heads = _req(cfg, "num_attention_heads")
    n_kv = cfg.get("num_key_value_heads") or n_heads
    head_dim = cfg.get("head_dim") or h // n_heads
    return n_heads, n_kv, head_dim


def _is_moe_layer(arch: str, cfg: dict, i: int) -> bool:
    if arch == "Qwen3MoeForCausalLM":
        n_exp = cfg.get("num_experts", cfg.get("num_local_experts", 0)) or 0
        step = cfg.get("decoder_sparse_step", 1) or 1
        return i not in (cfg.get("mlp_only_layers") or []) and n_exp > 0 and (i + 1) % step == 0
    if arch == "DeepseekV3ForCausalLM":
        n_exp = cfg.get("n_routed_experts") or 0
        freq = cfg.get("moe_layer_freq", 1) or 1
        return n_exp > 0 and i >= cfg.get("first_k_dense_replace", 0) and i % freq == 0
    return False


def _num_experts(arch: str, cfg: dict) -> int:
    if arch == "Qwen3MoeForCausalLM":
        return cfg.get("num_experts", cfg.get("num_local_experts", 0)) or 0
    return cfg.get("n_routed_experts") or 0


def _mlp(prefix: str, h: int, inter: int, bias: bool, group: str, layer: int) -> list[LinearSpec]:
    return [
        LinearSpec(f"{prefix}.gate_proj", h, inter, bias, group, layer),
        LinearSpec(f"{prefix}.up_proj", h, inter, bias, group, layer),
        LinearSpec(f"{prefix}.down_proj", inter, h, bias, f"{prefix}.down_proj", layer),
    ]


def decoder_linears(hf_config: dict) -> list[LinearSpec]:
    """All quantized linears of the decoder layers (not ``lm_head``), in checkpoint order."""
    arch = architecture_of(hf_config)
    cfg = hf_config
    h = _req(cfg, "hidden_size")
    out: list[LinearSpec] = []
    for i in range(_req(cfg, "num_hidden_layers")):
        p = f"model.layers.{i}"
        attn_group = f"{p}.attn_in"
        if arch == "DeepseekV3ForCausalLM":
            n_heads = _req(cfg, "num_attention_heads")
            nope, rope, v_dim = _req(cfg, "qk_nope_head_dim"), _req(cfg, "qk_rope_head_dim"), _req(cfg, "v_head_dim")
            kv_rank, q_rank = _req(cfg, "kv_lora_rank"), cfg.get("q_lora_rank")
            b = bool(cfg.get("attention_bias", False))
            a = f"{p}.self_attn"
            if q_rank:
                out.append(LinearSpec(f"{a}.q_a_proj", h, q_rank, b, attn_group, i))
                out.append(LinearSpec(f"{a}.q_b_proj", q_rank, n_heads * (nope + rope), False, f"{a}.q_b_proj", i))
            else:
                out.append(LinearSpec(f"{a}.q_proj", h, n_heads * (nope + rope), False, attn_group, i))
            out.append(LinearSpec(f"{a}.kv_a_proj_with_mqa", h, kv_rank + rope, b, attn_group, i))
            out.append(LinearSpec(f"{a}.kv_b_proj", kv_rank, n_heads * (nope + v_dim), False, f"{a}.kv_b_proj", i))
            out.append(LinearSpec(f"{a}.o_proj", n_heads * v_dim, h, b, f"{a}.o_proj", i))
        else:
            n_heads, n_kv, hd = _attn_dims(cfg)
            if arch == "Qwen2ForCausalLM":
                qkv_bias, o_bias = True, False
            else:
                qkv_bias = o_bias = bool(cfg.get("attention_bias", False))
            a = f"{p}.self_attn"
            out += [
                LinearSpec(f"{a}.q_proj", h, n_heads * hd, qkv_bias, attn_group, i),
                LinearSpec(f"{a}.k_proj", h, n_kv * hd, qkv_bias, attn_group, i),
                LinearSpec(f"{a}.v_proj", h, n_kv * hd, qkv_bias, attn_group, i),
                LinearSpec(f"{a}.o_proj", n_heads * hd, h, o_bias, f"{a}.o_proj", i),
            ]
        mlp_bias = bool(cfg.get("mlp_bias", False)) if arch == "LlamaForCausalLM" else False
        mlp_group = f"{p}.mlp_in"
        if _is_moe_layer(arch, cfg, i):
            moe_inter = _req(cfg, "moe_intermediate_size")
            for e in range(_num_experts(arch, cfg)):
                out += _mlp(f"{p}.mlp.experts.{e}", h, moe_inter, False, mlp_group, i)
            n_shared = (cfg.get("n_shared_experts") or 0) if arch == "DeepseekV3ForCausalLM" else 0
            if n_shared:
                out += _mlp(f"{p}.mlp.shared_experts", h, moe_inter * n_shared, False, mlp_group, i)
        else:
            out += _mlp(f"{p}.mlp", h, _req(cfg, "intermediate_size"), mlp_bias, mlp_group, i)
    return out


def head_linear(hf_config: dict) -> LinearSpec:
    """The ``lm_head`` linear (hidden_size -> vocab_size, no bias)."""
    return LinearSpec("lm_head", _req(hf_config, "hidden_size"), _req(hf_config, "vocab_size"), False, "lm_head", None)


def dense_tensors(hf_config: dict, include_lm_head: bool = False) -> list[DenseSpec]:
    """Unquantized tensors (embedding, norms, routers; ``lm_head.weight`` when ``include_lm_head``), in order.

    Layer-level tensors are listed per layer after that layer's linears would be, final norm and lm_head last
    (the writer orders modules as ``model.embed_tokens``, then layer by layer, then ``model.norm``, ``lm_head``).
    """
    return [d for _, d in _ordered(hf_config, include_lm_head) if isinstance(d, DenseSpec)]


def _ordered(hf_config: dict, include_lm_head_dense: bool) -> list[tuple[int, LinearSpec | DenseSpec]]:
    arch = architecture_of(hf_config)
    cfg = hf_config
    h = _req(cfg, "hidden_size")
    v = _req(cfg, "vocab_size")
    items: list[LinearSpec | DenseSpec] = [DenseSpec("model.embed_tokens.weight", (v, h), "embed")]
    linears = decoder_linears(cfg)
    by_layer: dict[int, list[LinearSpec]] = {}
    for lin in linears:
        by_layer.setdefault(lin.layer, []).append(lin)
    for i in range(_req(cfg, "num_hidden_layers")):
        p = f"model.layers.{i}"
        items.append(DenseSpec(f"{p}.input_layernorm.weight", (h,), "norm"))
        items += [lin for lin in by_layer.get(i, []) if ".self_attn." in lin.key]
        if arch == "Qwen3ForCausalLM" or arch == "Qwen3MoeForCausalLM":
            hd = _attn_dims(cfg)[2]
            items.append(DenseSpec(f"{p}.self_attn.q_norm.weight", (hd,), "norm"))
            items.append(DenseSpec(f"{p}.self_attn.k_norm.weight", (hd,), "norm"))
        if arch == "DeepseekV3ForCausalLM":
            if cfg.get("q_lora_rank"):
                items.append(DenseSpec(f"{p}.self_attn.q_a_layernorm.weight", (cfg["q_lora_rank"],), "norm"))
            items.append(DenseSpec(f"{p}.self_attn.kv_a_layernorm.weight", (cfg["kv_lora_rank"],), "norm"))
        items.append(DenseSpec(f"{p}.post_attention_layernorm.weight", (h,), "norm"))
        if _is_moe_layer(arch, cfg, i):
            items.append(DenseSpec(f"{p}.mlp.gate.weight", (_num_experts(arch, cfg), h), "router"))
            if arch == "DeepseekV3ForCausalLM":
                items.append(DenseSpec(f"{p}.mlp.gate.e_score_correction_bias", (_num_experts(arch, cfg),),
                                       "router_bias"))
        items += [lin for lin in by_layer.get(i, []) if ".self_attn." not in lin.key]
    items.append(DenseSpec("model.norm.weight", (h,), "norm"))
    if include_lm_head_dense:
        items.append(DenseSpec("lm_head.weight", (v, h), "lm_head"))
    return list(enumerate(items))


def modules_in_order(hf_config: dict, head_quantized: bool) -> list[LinearSpec | DenseSpec]:
    """Every stored item in checkpoint order; ``lm_head`` as a LinearSpec when quantized, else a DenseSpec."""
    items = [x for _, x in _ordered(hf_config, include_lm_head_dense=not head_quantized)]
    if head_quantized:
        items.append(head_linear(hf_config))
    return items


def hf_tensor_shapes(hf_config: dict) -> dict[str, tuple[int, ...]]:
    """The dense HF checkpoint's tensor names and shapes (what ``save_pretrained`` writes), lm_head included."""
    out: dict[str, tuple[int, ...]] = {}
    for item in modules_in_order(hf_config, head_quantized=True):
        if isinstance(item, DenseSpec):
            out[item.name] = item.shape
        else:
            out[f"{item.key}.weight"] = (item.out_features, item.in_features)
            if item.bias:
                out[f"{item.key}.bias"] = (item.out_features,)
    return out
