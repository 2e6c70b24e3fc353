"""HF config presets for synthetic checkpoints: tiny ones for tests, large ones for benchmarks.

Large presets copy the public ``config.json`` fields of the named models (Llama-3.1-8B, Qwen3-32B,
Qwen3-30B-A3B); ``dense_27b`` is a Qwen3-architecture model with Qwen3.5-27B-like linear shapes (hidden 5120,
MLP 17408, 64 layers). Tiny presets keep every field a real config of that architecture has, with small dims;
some dims are deliberately not multiples of 128 so that the writer's padding is exercised.
Each function returns a fresh dict.
"""

from __future__ import annotations

from collections.abc import Callable


def _llama_base() -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
    }


def tiny_llama() -> dict:
    """2-layer Llama; MLP 688 and vocab 1000 are padded to 768 / 1024 in storage."""
    c = _llama_base()
    c.update(hidden_size=256, intermediate_size=688, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=64, vocab_size=1000, max_position_embeddings=2048)
    return c


def llama_8b() -> dict:
    """Llama-3.1-8B dims and rope (llama3 scaling)."""
    c = _llama_base()
    c.update(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
             num_key_value_heads=8, head_dim=128, vocab_size=128256, max_position_embeddings=131072,
             bos_token_id=128000, eos_token_id=128001,
             rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 8192, "rope_type": "llama3"})
    return c


def tiny_qwen2() -> dict:
    """2-layer Qwen2 (q/k/v carry a bias)."""
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": 256,
        "initializer_range": 0.02,
        "intermediate_size": 512,
        "max_position_embeddings": 2048,
        "max_window_layers": 2,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 1024,
    }


def _qwen3_base() -> dict:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
    }


def tiny_qwen3() -> dict:
    """2-layer Qwen3 (q_norm/k_norm)."""
    c = _qwen3_base()
    c.update(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=64, vocab_size=1024, max_position_embeddings=2048,
             max_window_layers=2, bos_token_id=1, eos_token_id=2)
    return c


def qwen3_32b() -> dict:
    """Qwen3-32B dims."""
    c = _qwen3_base()
    c.update(hidden_size=5120, intermediate_size=25600, num_hidden_layers=64, num_attention_heads=64,
             num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
             max_window_layers=64)
    return c


def dense_27b() -> dict:
    """27B-class dense Qwen3-architecture model with Qwen3.5-27B-like shapes (MLP 5120 x 17408)."""
    c = _qwen3_base()
    c.update(hidden_size=5120, intermediate_size=17408, num_hidden_layers=64, num_attention_heads=24,
             num_key_value_heads=4, head_dim=256, vocab_size=248320, max_position_embeddings=262144,
             max_window_layers=64)
    return c


def _qwen3_moe_base() -> dict:
    c = _qwen3_base()
    c.update(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", decoder_sparse_step=1,
             norm_topk_prob=True, output_router_logits=False, router_aux_loss_coef=0.001)
    return c


def tiny_qwen3_moe() -> dict:
    """2-layer Qwen3-MoE: layer 0 dense MLP (``mlp_only_layers``), layer 1 with 4 experts (top-2)."""
    c = _qwen3_moe_base()
    c.update(hidden_size=256, intermediate_size=512, moe_intermediate_size=128, num_experts=4,
             num_experts_per_tok=2, mlp_only_layers=[0], num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=64, vocab_size=1024, max_position_embeddings=2048,
             max_window_layers=2, bos_token_id=1, eos_token_id=2)
    return c


def qwen3_30b_a3b() -> dict:
    """Qwen3-30B-A3B dims (128 experts, 8 active)."""
    c = _qwen3_moe_base()
    c.update(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_experts=128,
             num_experts_per_tok=8, mlp_only_layers=[], num_hidden_layers=48, num_attention_heads=32,
             num_key_value_heads=4, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
             max_window_layers=48)
    return c


def tiny_deepseek_v3() -> dict:
    """2-layer DeepSeek-V3: MLA (q/kv LoRA), layer 0 dense, layer 1 MoE with 4 routed + 1 shared expert.

    kv_a_proj_with_mqa has 128 + 64 = 192 outputs, padded to 256 in storage.
    """
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "first_k_dense_replace": 1,
        "hidden_act": "silu",
        "hidden_size": 256,
        "initializer_range": 0.02,
        "intermediate_size": 512,
        "kv_lora_rank": 128,
        "max_position_embeddings": 2048,
        "moe_intermediate_size": 128,
        "moe_layer_freq": 1,
        "n_group": 1,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "norm_topk_prob": True,
        "num_attention_heads": 4,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 2,
        "num_key_value_heads": 4,
        "num_nextn_predict_layers": 0,
        "q_lora_rank": 128,
        "qk_nope_head_dim": 64,
        "qk_rope_head_dim": 64,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 10000,
        "routed_scaling_factor": 2.5,
        "scoring_func": "sigmoid",
        "tie_word_embeddings": False,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "v_head_dim": 64,
        "vocab_size": 1024,
    }


PRESETS: dict[str, Callable[[], dict]] = {
    "tiny_llama": tiny_llama,
    "tiny_qwen2": tiny_qwen2,
    "tiny_qwen3": tiny_qwen3,
    "tiny_qwen3_moe": tiny_qwen3_moe,
    "tiny_deepseek_v3": tiny_deepseek_v3,
    "llama_8b": llama_8b,
    "qwen3_32b": qwen3_32b,
    "dense_27b": dense_27b,
    "qwen3_30b_a3b": qwen3_30b_a3b,
}

TINY_PRESETS = ("tiny_llama", "tiny_qwen2", "tiny_qwen3", "tiny_qwen3_moe", "tiny_deepseek_v3")


def preset(name: str) -> dict:
    """A fresh copy of the named preset config. Raises ValueError listing the names."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; expected one of {sorted(PRESETS)}")
    return PRESETS[name]()
