"""Real exllamav3-converted checkpoints (tests/data/exl3, made by tools/exllamav3_reference.py on the GPU
machine) read through exl3-format and dequantized by the pure-torch reference give the logits exllamav3
itself computed on them.

A dense HF model is built from the checkpoint (W = reference.dense_weight(...), HF weight = W.T; other
tensors as stored) and run on CPU in fp32 on the recorded prompt. exllamav3 ran the same checkpoint on the
H200 with fp16 activations, so the two differ by fp16 rounding of activations only; the bounds below are
~3x the largest difference measured on these four checkpoints (values in the test).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file  # noqa: E402

from exl3_format import load_checkpoint  # noqa: E402
from exl3_kernels import reference  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "exl3"
NAMES = ["tiny-llama-4.0bpw-mcg", "tiny-llama-3.0bpw-mul1-hb6", "tiny-qwen2-random-4.0bpw-mul1",
         "tiny-qwen3-random-4.0bpw-mcg"]


def dense_hf_model(ckpt_dir: Path) -> torch.nn.Module:
    """The checkpoint as a plain fp32 transformers model (every EXL3 linear dequantized)."""
    ckpt = load_checkpoint(ckpt_dir)
    cfg = json.loads((ckpt_dir / "config.json").read_text())
    cfg.pop("quantization_config", None)
    config = transformers.AutoConfig.for_model(**cfg)
    model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    raw = load_file(str(ckpt_dir / "model.safetensors"))
    state = {}
    for key, lin in ckpt.linears.items():
        w = reference.dense_weight(raw[f"{key}.trellis"], raw[f"{key}.suh"], raw[f"{key}.svh"],
                                   codebook=lin.codebook.value)
        state[f"{key}.weight"] = w.float().T.contiguous()
        if lin.has_bias:
            state[f"{key}.bias"] = raw[f"{key}.bias"].float()
    for name in ckpt.other_tensors:
        state[name] = raw[name].float()
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert all("rotary" in m for m in missing), missing
    return model.eval()


@pytest.mark.parametrize("name", NAMES)
def test_dense_reference_matches_exllamav3_logits(name):
    ref = load_file(str(DATA / "exllamav3_reference.safetensors"))
    ids, logits_ex = ref[f"{name}.ids"], ref[f"{name}.logits"]
    model = dense_hf_model(DATA / name)
    with torch.inference_mode():
        logits = model(ids[None]).logits[0].float()
    lp, lp_ex = torch.log_softmax(logits, -1), torch.log_softmax(logits_ex, -1)
    # measured (CPU fp32 dense vs exllamav3 on the H200): max |d logprob| 0.0134 / 0.0134 / 0.0016 / 0.0024,
    # max KL 4.0e-6, one top-1 flip (qwen2, position 21) where exllamav3's own margin was 0.001 nats
    assert (lp - lp_ex).abs().max().item() < 0.04, name
    assert (lp_ex.exp() * (lp_ex - lp)).sum(-1).max().item() < 1e-5, name
    ours, theirs = logits.argmax(-1), logits_ex.argmax(-1)
    for i in (ours != theirs).nonzero().flatten().tolist():
        margin = (lp_ex[i, theirs[i]] - lp_ex[i, ours[i]]).item()
        assert margin < 0.005, (name, i, margin)  # only near-ties may flip


def test_checkpoints_parse_with_expected_k_and_codebook():
    for name, K, cb in [("tiny-llama-4.0bpw-mcg", None, "mcg"), ("tiny-llama-3.0bpw-mul1-hb6", 3.0, "mul1"),
                        ("tiny-qwen2-random-4.0bpw-mul1", None, "mul1"), ("tiny-qwen3-random-4.0bpw-mcg", None, "mcg")]:
        ckpt = load_checkpoint(DATA / name)
        assert {lin.codebook.value for lin in ckpt.linears.values()} == {cb}
        assert ckpt.linears["lm_head"].K == 6.0
        if K is not None:
            assert {lin.K for k, lin in ckpt.linears.items() if k != "lm_head"} == {K}
    q2 = load_checkpoint(DATA / "tiny-qwen2-random-4.0bpw-mul1")
    assert q2.linears["model.layers.0.self_attn.q_proj"].has_bias
