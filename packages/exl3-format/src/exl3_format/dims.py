"""Unpadded (logical) dims of a linear, from ``config.json``.

exllamav3 rounds both dims of every linear up to a multiple of 128 (``pad_to=128``, exllamav3 1.6.5
``modules/linear.py`` L75-78; ``docs/exl3-format.md`` §1.6), so the header gives only padded dims. The logical
dims come from the (text) config. Each projection name has a few candidate formulas (e.g. expert ``up_proj`` is
``moe_intermediate_size`` x ``hidden_size``); a candidate is accepted only when it pads to exactly the stored dim,
so a wrong guess yields ``None`` ("unknown") rather than a wrong number.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .naming import ROLE_MTP, module_role, parse_expert_key, projection_name

__all__ = ["PAD_TO", "pad_dim", "unpadded_dims"]

#: exllamav3's padding granule for linear dims (``modules/linear.py`` L75-78).
PAD_TO = 128

_Formula = Callable[[Mapping[str, Any]], Any]


def pad_dim(size: int, granule: int = PAD_TO) -> int:
    """Round ``size`` up to a multiple of ``granule``."""
    return -(-size // granule) * granule


def _get(cfg: Mapping[str, Any], *names: str) -> Any:
    for name in names:
        value = cfg.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _hidden(c):
    return _get(c, "hidden_size", "d_model", "n_embd")


def _heads(c):
    return _get(c, "num_attention_heads", "n_head")


def _kv_heads(c):
    return _get(c, "num_key_value_heads", "num_attention_heads")


def _head_dim(c):
    head_dim = _get(c, "head_dim")
    if head_dim is None and _hidden(c) and _heads(c):
        head_dim = _hidden(c) // _heads(c)
    return head_dim


def _mul(*values):
    out = 1
    for v in values:
        if v is None:
            return None
        out *= v
    return out


def _add(*values):
    return None if any(v is None for v in values) else sum(values)


def _qk_head_dim(c):
    return _add(_get(c, "qk_nope_head_dim"), _get(c, "qk_rope_head_dim"))


def _lin_k(c):  # gated-delta-net key projection width (Qwen3-Next / Qwen3.5)
    return _mul(_get(c, "linear_num_key_heads"), _get(c, "linear_key_head_dim"))


def _lin_v(c):
    return _mul(_get(c, "linear_num_value_heads"), _get(c, "linear_value_head_dim"))


_INTER = (lambda c: _get(c, "intermediate_size", "ffn_dim", "n_inner"),)
_MOE_INTER = (lambda c: _get(c, "moe_intermediate_size", "expert_intermediate_size"), *_INTER)
_SHARED_INTER = (
    lambda c: _get(c, "shared_expert_intermediate_size"),
    lambda c: _mul(_get(c, "moe_intermediate_size"), _get(c, "n_shared_experts")),
    *_MOE_INTER,
)

# projection -> (candidate formulas for k, candidate formulas for n); MLP rows are filled in per context.
_ATTN_TABLE: dict[str, tuple[tuple[_Formula, ...], tuple[_Formula, ...]]] = {
    "q_proj": (
        (_hidden,),
        (
            lambda c: _mul(_heads(c), _head_dim(c)),
            lambda c: _mul(2, _heads(c), _head_dim(c)),  # gated attention (query + gate)
            lambda c: _mul(_heads(c), _qk_head_dim(c)),  # MLA without q LoRA
        ),
    ),
    "k_proj": ((_hidden,), (lambda c: _mul(_kv_heads(c), _head_dim(c)),)),
    "v_proj": ((_hidden,), (lambda c: _mul(_kv_heads(c), _head_dim(c)),)),
    "o_proj": (
        (lambda c: _mul(_heads(c), _head_dim(c)), lambda c: _mul(_heads(c), _get(c, "v_head_dim"))),
        (_hidden,),
    ),
    "q_a_proj": ((_hidden,), (lambda c: _get(c, "q_lora_rank"),)),
    "q_b_proj": ((lambda c: _get(c, "q_lora_rank"),), (lambda c: _mul(_heads(c), _qk_head_dim(c)),)),
    "kv_a_proj_with_mqa": (
        (_hidden,),
        (lambda c: _add(_get(c, "kv_lora_rank"), _get(c, "qk_rope_head_dim")),),
    ),
    "kv_b_proj": (
        (lambda c: _get(c, "kv_lora_rank"),),
        (lambda c: _mul(_heads(c), _add(_get(c, "qk_nope_head_dim"), _get(c, "v_head_dim"))),),
    ),
    "lm_head": ((_hidden,), (lambda c: _get(c, "vocab_size"),)),
    "eh_proj": ((lambda c: _mul(2, _hidden(c)),), (_hidden,)),
    "in_proj_qkvz": ((_hidden,), (lambda c: _add(_mul(2, _lin_k(c)), _mul(2, _lin_v(c))),)),
    "in_proj_ba": ((_hidden,), (lambda c: _mul(2, _get(c, "linear_num_value_heads")),)),
    "in_proj_qkv": ((_hidden,), (lambda c: _add(_mul(2, _lin_k(c)), _lin_v(c)),)),
    "in_proj_z": ((_hidden,), (_lin_v,)),
    "in_proj_b": ((_hidden,), (lambda c: _get(c, "linear_num_value_heads"),)),
    "in_proj_a": ((_hidden,), (lambda c: _get(c, "linear_num_value_heads"),)),
    "out_proj": ((_lin_v,), (_hidden,)),
}
_UP = frozenset({"gate_proj", "up_proj", "w1", "w3"})
_DOWN = frozenset({"down_proj", "w2"})


def _pick(candidates: tuple[_Formula, ...], cfg: Mapping[str, Any], stored: int) -> int | None:
    for formula in candidates:
        value = formula(cfg)
        if not isinstance(value, int) or value <= 0:
            continue
        if value == stored or (stored % PAD_TO == 0 and pad_dim(value) == stored):
            return value
    return None


def unpadded_dims(key: str, config: Mapping[str, Any], k: int, n: int) -> tuple[int | None, int | None]:
    """Logical ``(k, n)`` (in, out features) of linear ``key``, or ``None`` per dim when unknown.

    Args:
        key: module key, e.g. ``"model.layers.0.mlp.experts.3.down_proj"``.
        config: the text config (``config.json``, or its nested ``text_config``).
        k, n: stored (padded) in/out features, ``16·trellis.shape[0]`` and ``16·trellis.shape[1]``.

    Returns:
        A dim is reported only when a config formula for this projection pads to exactly the stored dim.
    """
    proj = projection_name(key)
    if proj in _ATTN_TABLE:
        k_cands, n_cands = _ATTN_TABLE[proj]
    elif proj in _UP or proj in _DOWN:
        if parse_expert_key(key) is not None:
            inter = _MOE_INTER
        elif "shared_expert" in key or "shared_experts" in key:
            inter = _SHARED_INTER
        else:
            inter = _INTER
        k_cands, n_cands = ((_hidden,), inter) if proj in _UP else (inter, (_hidden,))
    elif proj == "fc" and module_role(key) == ROLE_MTP:  # Qwen3-Next MTP: concat(embed, hidden) -> hidden
        k_cands, n_cands = (lambda c: _mul(2, _hidden(c)),), (_hidden,)
    else:
        return None, None
    return _pick(k_cands, config, k), _pick(n_cands, config, n)
