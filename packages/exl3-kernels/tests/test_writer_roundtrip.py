"""Writer round trip: what is written reads back (safetensors, exl3-format, reference) to what was intended."""

from __future__ import annotations

import json
import os

import pytest
import torch
from exl3_kernels.reference import MARKER_INT32, dense_weight, linear_forward, reconstruct
from exl3_kernels.writer import TINY_PRESETS, plan_checkpoint, preset, write_checkpoint
from safetensors import safe_open
from safetensors.torch import load_file

# Mixed K inside the fused q/k/v group, a half-rate mul1 tensor, a 3inst tensor, an unpadded 688-wide MLP
# (tiny_llama) and a 192-wide kv_a (tiny_deepseek_v3) are all exercised by every preset below.
OVERRIDES = {"*.k_proj": 5, "*.v_proj": 3, "*.kv_a_proj_with_mqa": 5, "model.layers.0.mlp.down_proj": 2.5,
             "*.experts.1.up_proj": 3.5}
CB_OVERRIDES = {"model.layers.0.mlp.down_proj": "mul1", "*.experts.1.up_proj": "mul1", "*.o_proj": "3inst"}


def _read_all(path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(os.listdir(path)):
        if f.endswith(".safetensors"):
            out.update(load_file(os.path.join(path, f)))
    return out


@pytest.fixture(scope="module", params=TINY_PRESETS)
def written(request, tmp_path_factory):
    name = request.param
    cfg = preset(name)
    out = tmp_path_factory.mktemp(name)
    got = {}
    path = write_checkpoint(out, cfg, default_bits=4, overrides=OVERRIDES, codebook="mcg",
                            codebook_overrides=CB_OVERRIDES, head_bits=6, seed=7, weights="random",
                            on_linear=lambda q: got.__setitem__(q.spec.key, q))
    plan = plan_checkpoint(cfg, default_bits=4, overrides=OVERRIDES, codebook="mcg",
                           codebook_overrides=CB_OVERRIDES, head_bits=6)
    return name, cfg, path, got, plan


def test_reference_reads_back_intended_weights(written):
    name, cfg, path, got, plan = written
    sd = _read_all(path)
    assert set(got) == {it.spec.key for it in plan.linears()}
    for key, q in got.items():
        trellis = sd[f"{key}.trellis"]
        assert torch.equal(trellis, q.trellis)
        # bit-exact: the decoded file == the w_hat the writer built from its states (independent code path)
        w_hat = reconstruct(trellis, codebook=q.codebook)
        assert torch.equal(w_hat.view(torch.int16), q.w_hat.view(torch.int16)), key
        assert torch.equal(sd[f"{key}.suh"], q.suh) and torch.equal(sd[f"{key}.svh"], q.svh)
        assert torch.isfinite(q.suh).all() and torch.isfinite(q.svh).all()
        if q.spec.bias:
            assert torch.equal(sd[f"{key}.bias"], q.bias) and sd[f"{key}.bias"].dtype == torch.float16
        else:
            assert f"{key}.bias" not in sd
        for cb in ("mcg", "mul1"):
            marker = sd.get(f"{key}.{cb}")
            if cb == q.codebook:
                assert marker.shape == () and marker.dtype == torch.int32 and int(marker) == MARKER_INT32[cb]
            else:
                assert marker is None


def test_dense_weights_and_forward_sane(written):
    name, cfg, path, got, plan = written
    sd = _read_all(path)
    q = got["model.layers.0.self_attn.o_proj"]
    assert q.codebook == "3inst" and f"{q.spec.key}.mcg" not in sd
    w = dense_weight(sd[f"{q.spec.key}.trellis"], sd[f"{q.spec.key}.suh"], sd[f"{q.spec.key}.svh"],
                     codebook=q.codebook)
    assert torch.isfinite(w).all()
    # activations: unit-RMS input -> outputs of RMS ~ gain (0.5 for o_proj), like a real model's projections
    x = torch.randn(8, q.k, generator=torch.Generator().manual_seed(0)).half()
    x[:, q.spec.in_features:] = 0
    y = linear_forward(x, q.trellis, q.suh, q.svh, q.codebook, out_dtype=torch.float32)
    rms = y[:, : q.spec.out_features].pow(2).mean().sqrt().item()
    assert 0.25 < rms < 1.0, rms


def test_mixed_k_and_half_rate(written):
    name, cfg, path, got, plan = written
    K = {k: q.K for k, q in got.items()}
    if "model.layers.0.self_attn.k_proj" in K:  # q/k/v attention: mixed K inside the fused group
        assert (K["model.layers.0.self_attn.q_proj"], K["model.layers.0.self_attn.k_proj"],
                K["model.layers.0.self_attn.v_proj"]) == (4.0, 5.0, 3.0)
    down = got["model.layers.0.mlp.down_proj"]
    assert down.K == 2.5 and down.codebook == "mul1" and down.trellis.shape[-1] == 40
    assert got["lm_head"].K == 6.0 and got["lm_head"].trellis.shape[-1] == 96
    if name == "tiny_qwen3_moe" or name == "tiny_deepseek_v3":
        up = got["model.layers.1.mlp.experts.1.up_proj"]
        assert up.K == 3.5 and up.codebook == "mul1"


def test_padding(written):
    name, cfg, path, got, plan = written
    for q in got.values():
        assert q.k % 128 == 0 and q.n % 128 == 0
        assert q.k - q.spec.in_features < 128 and q.n - q.spec.out_features < 128
        assert tuple(q.trellis.shape[:2]) == (q.k // 16, q.n // 16)
        if q.bias is not None:
            assert (q.bias[q.spec.out_features:] == 0).all()
    if name == "tiny_llama":
        assert got["model.layers.0.mlp.down_proj"].k == 768 and got["lm_head"].n == 1024
    if name == "tiny_deepseek_v3":
        assert got["model.layers.0.self_attn.kv_a_proj_with_mqa"].n == 256


def test_config_and_quantization_config(written):
    name, cfg, path, got, plan = written
    config = json.loads((path / "config.json").read_text())
    for k, v in cfg.items():
        if k != "tie_word_embeddings":
            assert config[k] == v, k
    assert config["tie_word_embeddings"] is False
    qc = config["quantization_config"]
    assert qc["quant_method"] == "exl3" and qc["head_bits"] == 6 and qc["codebook"] == "mcg"
    assert qc["calibration"] == {"rows": 0, "cols": 0} and qc["out_scales"] == "always"
    dec = [q for k, q in got.items() if k != "lm_head"]
    expect_bits = sum(q.K * q.k * q.n for q in dec) / sum(q.k * q.n for q in dec)
    assert qc["bits"] == round(expect_bits, 2)
    qcj = json.loads((path / "quantization_config.json").read_text())
    storage = qcj.pop("tensor_storage")
    assert qcj == qc
    # tensor_storage agrees with the safetensors headers, tensor by tensor
    headers = {}
    for f in path.glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as h:
            for n in h.keys():
                t = h.get_tensor(n)
                headers[n] = (list(t.shape), t.numel() * t.element_size(), str(t.dtype))
    listed = {}
    for module, entry in storage.items():
        for n, meta in entry["stored_tensors"].items():
            assert n == module or n.startswith(module + ".")
            listed[n] = (meta["shape"], meta["n_bytes"], meta["dtype"])
    assert listed == headers
    for key, q in got.items():
        e = storage[key]
        assert e["quant_format"] == "exl3" and e["bits_per_weight"] == (int(q.K) if q.K.is_integer() else q.K)
        assert ("mcg_multiplier" in e) == (q.codebook == "mcg") and ("mul1_multiplier" in e) == (q.codebook == "mul1")


def test_unquantized_tensors(written):
    name, cfg, path, got, plan = written
    sd = _read_all(path)
    v, h = cfg["vocab_size"], cfg["hidden_size"]
    assert sd["model.embed_tokens.weight"].shape == (v, h) and sd["model.embed_tokens.weight"].dtype == torch.bfloat16
    assert sd["model.norm.weight"].dtype == torch.bfloat16 and "lm_head.weight" not in sd
    if name in ("tiny_qwen3", "tiny_qwen3_moe"):
        assert sd["model.layers.1.self_attn.q_norm.weight"].shape == (64,)
    if name == "tiny_qwen3_moe":
        assert sd["model.layers.1.mlp.gate.weight"].shape == (4, h) and "model.layers.0.mlp.gate.weight" not in sd
    if name == "tiny_deepseek_v3":
        assert sd["model.layers.1.mlp.gate.e_score_correction_bias"].dtype == torch.float32
        assert sd["model.layers.0.self_attn.kv_a_layernorm.weight"].shape == (128,)


def test_exl3_format_reads_it(written):
    name, cfg, path, got, plan = written
    import exl3_format  # a hard dependency of exl3-kernels: never skipped

    ck = exl3_format.load_checkpoint(path)
    assert set(ck.linears) == set(got)
    for key, q in got.items():
        lin = ck.linears[key]
        assert (lin.key, lin.k, lin.n, float(lin.K), lin.has_bias) == (key, q.k, q.n, q.K, q.bias is not None)
        assert getattr(lin.codebook, "value", lin.codebook) == q.codebook
    assert not getattr(ck, "hint_mismatches", [])


def test_deterministic_by_seed(tmp_path):
    cfg = preset("tiny_qwen3")
    a = write_checkpoint(tmp_path / "a", cfg, seed=3)
    b = write_checkpoint(tmp_path / "b", cfg, seed=3)
    c = write_checkpoint(tmp_path / "c", cfg, seed=4)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()


def test_sharding_and_index(tmp_path):
    cfg = preset("tiny_qwen3_moe")
    path = write_checkpoint(tmp_path, cfg, shard_bytes=200_000)
    shards = sorted(p.name for p in path.glob("*.safetensors"))
    assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    index = json.loads((path / "model.safetensors.index.json").read_text())
    seen = {}
    for s in shards:
        with safe_open(str(path / s), framework="pt") as h:
            for n in h.keys():
                seen[n] = s
                t = h.get_tensor(n)
                index["metadata"]["total_size"] -= t.numel() * t.element_size()
    assert index["weight_map"] == seen and index["metadata"]["total_size"] == 0
    # one module never straddles two shards
    for key in ("model.layers.1.mlp.experts.2.up_proj", "lm_head"):
        assert len({seen[n] for n in seen if n.startswith(key + ".")}) == 1


def test_head_bits_16_stores_fp16_lm_head(tmp_path):
    cfg = preset("tiny_llama")
    path = write_checkpoint(tmp_path, cfg, head_bits=16)
    sd = _read_all(path)
    assert "lm_head.trellis" not in sd
    assert sd["lm_head.weight"].dtype == torch.float16 and sd["lm_head.weight"].shape == (1000, 256)
    qc = json.loads((path / "config.json").read_text())["quantization_config"]
    assert qc["head_bits"] == 16


def test_bad_arguments(tmp_path):
    cfg = preset("tiny_llama")
    msg = r"model.layers.0.mlp.gate_proj: in=256, out=688: EXL3 needs both to be multiples of 128"
    with pytest.raises(ValueError, match=msg):
        write_checkpoint(tmp_path, cfg, pad_to_128=False)
    with pytest.raises(ValueError, match="half rate, which requires the mul1 codebook"):
        write_checkpoint(tmp_path, cfg, overrides={"*.q_proj": 2.5})
    with pytest.raises(ValueError, match="invalid EXL3 bits per weight"):
        write_checkpoint(tmp_path, cfg, default_bits=4.5)
    with pytest.raises(ValueError, match="weights must be one of"):
        write_checkpoint(tmp_path, cfg, weights="zeros")
    with pytest.raises(ValueError, match="needs source_dir"):
        write_checkpoint(tmp_path, cfg, weights="encode")
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_no_padding_when_aligned(tmp_path):
    cfg = preset("tiny_qwen3")
    got = {}
    write_checkpoint(tmp_path, cfg, pad_to_128=False, on_linear=lambda q: got.__setitem__(q.spec.key, q))
    assert all((q.k, q.n) == (q.spec.in_features, q.spec.out_features) for q in got.values())
