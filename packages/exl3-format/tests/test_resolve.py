"""Engine-name to checkpoint-key resolution."""

from __future__ import annotations

from exl3_format import DEFAULT_PACKED_MODULES, ResolveMethod, resolve_module_names


def test_exact_then_reordered_then_dropped():
    ckpt = [
        "model.language_model.layers.0.self_attn.q_proj",
        "model.language_model.layers.0.mlp.down_proj",
        "model.visual.blocks.0.attn.qkv",
        "lm_head",
        "model.mtp.layers.0.mlp.down_proj",
    ]
    engine = [
        "language_model.model.layers.0.self_attn.q_proj",  # vLLM's order
        "model.language_model.layers.0.mlp.down_proj",  # exact
        "visual.blocks.0.attn.qkv",  # wrapper dropped
        "language_model.lm_head",  # wrapper added
        "model.layers.0.mlp.gate_proj",  # absent
    ]
    res = resolve_module_names(engine, ckpt)
    assert res.mapping == {
        "language_model.model.layers.0.self_attn.q_proj": "model.language_model.layers.0.self_attn.q_proj",
        "model.language_model.layers.0.mlp.down_proj": "model.language_model.layers.0.mlp.down_proj",
        "visual.blocks.0.attn.qkv": "model.visual.blocks.0.attn.qkv",
        "language_model.lm_head": "lm_head",
    }
    assert res.how["language_model.model.layers.0.self_attn.q_proj"] is ResolveMethod.REORDERED
    assert res.how["model.language_model.layers.0.mlp.down_proj"] is ResolveMethod.EXACT
    assert res.how["visual.blocks.0.attn.qkv"] is ResolveMethod.WRAPPER_DROPPED
    assert res.how["language_model.lm_head"] is ResolveMethod.WRAPPER_DROPPED
    assert res.unresolved_engine == ["model.layers.0.mlp.gate_proj"]
    assert res.unclaimed_checkpoint == ["model.mtp.layers.0.mlp.down_proj"]
    assert res.counts() == {"exact": 1, "wrapper-dropped": 2, "reordered": 1, "fused": 0, "unresolved": 1}
    warnings = res.warnings()
    assert warnings[0].startswith("1 engine module name(s) not found in the checkpoint: model.layers.0.mlp.gate_proj")
    assert warnings[1].startswith("1 checkpoint module(s) not claimed")


def test_exact_match_claims_first_and_ambiguity():
    ckpt = ["model.layers.0.x", "layers.0.x", "language_model.layers.1.y", "model.layers.1.y"]
    res = resolve_module_names(["layers.0.x", "model.model.layers.0.x", "layers.1.y"], ckpt)
    # exact claims layers.0.x; the other engine name then gets the remaining candidate
    assert res.mapping["layers.0.x"] == "layers.0.x"
    assert res.mapping["model.model.layers.0.x"] == "model.layers.0.x"
    assert res.how["model.model.layers.0.x"] is ResolveMethod.WRAPPER_DROPPED
    # two equally good candidates: ambiguous, unresolved
    assert res.ambiguous == {"layers.1.y": ["language_model.layers.1.y", "model.layers.1.y"]}
    assert "layers.1.y" in res.unresolved_engine
    assert any("ambiguous" in w for w in res.warnings())


def test_same_wrappers_preferred_among_candidates():
    ckpt = ["model.language_model.layers.0.q", "layers.0.q"]
    res = resolve_module_names(["language_model.model.layers.0.q"], ckpt)
    assert res.mapping == {"language_model.model.layers.0.q": "model.language_model.layers.0.q"}
    assert res.how["language_model.model.layers.0.q"] is ResolveMethod.REORDERED


def test_fused_names_and_children():
    ckpt = [
        "model.language_model.layers.0.self_attn.q_proj",
        "model.language_model.layers.0.self_attn.k_proj",
        "model.language_model.layers.0.self_attn.v_proj",
        "model.language_model.layers.0.mlp.experts",
        "model.language_model.layers.0.mlp.experts.0.up_proj",
        "model.language_model.layers.0.mlp.experts.1.up_proj",
    ]
    engine = ["language_model.model.layers.0.self_attn.qkv_proj", "language_model.model.layers.0.mlp.experts"]
    res = resolve_module_names(engine, ckpt, DEFAULT_PACKED_MODULES)
    assert res.fused == {
        "language_model.model.layers.0.self_attn.qkv_proj": tuple(
            f"model.language_model.layers.0.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj")
        )
    }
    assert res.how["language_model.model.layers.0.self_attn.qkv_proj"] is ResolveMethod.FUSED
    assert res.mapping == {"language_model.model.layers.0.mlp.experts": "model.language_model.layers.0.mlp.experts"}
    assert res.unresolved_engine == [] and res.unclaimed_checkpoint == []
    # without packed_modules the fused name does not resolve
    assert resolve_module_names(engine, ckpt).unresolved_engine == ["language_model.model.layers.0.self_attn.qkv_proj"]


def test_partial_fused_is_unresolved():
    res = resolve_module_names(
        ["model.layers.0.mlp.gate_up_proj"], ["model.layers.0.mlp.gate_proj"], DEFAULT_PACKED_MODULES
    )
    assert res.unresolved_engine == ["model.layers.0.mlp.gate_up_proj"] and res.fused == {}
    assert res.unclaimed_checkpoint == ["model.layers.0.mlp.gate_proj"]
