"""Llama / Qwen2 / Qwen3 built by vLLM from synthetic EXL3 checkpoints, on the CPU platform, against dense references.

Each model goes through vLLM's whole load path (``EngineArgs`` -> ``get_model``: quant config selection,
``maybe_update_config``, construction, ``load_weights``, ``process_weights_after_loading``). Then every EXL3 module,
every MLP block and the whole model (attention replaced by a torch SDPA, see ``exl3_vllm_testutil``) are compared
with dense weights from ``exl3_kernels.reference.dense_weight``.

Tolerances (max |y - ref| over max |ref|) come from the numerics of the op's reference path and are about twice
the worst value measured over the three models (measured on this CPU box, 2026-11-30):
* fp32 activations: exact fp32 math on the exact decoded weights; the dense reference rounds W to fp16
  (``dense_weight`` returns fp16, 2^-11 relative per weight). Measured 3.1e-4 per module, 4.7e-4 for the whole
  model's logits -> 1e-3.
* fp16: the op also rounds the rotated activations to fp16 (what the tensor-core kernel feeds its MMA) and the
  output to fp16. Measured 9.0e-4 -> 2e-3.
* bf16: the output is rounded to bf16 (2^-9 relative per element). Measured 3.4e-3 -> 8e-3.
A wrong shard, transposed weight or missing scale gives errors of order 1.
"""

from __future__ import annotations

import pytest
import torch
from exl3_vllm_testutil import (
    build_model,
    checkpoint_tensors,
    config_of,
    dense,
    engine_config,
    exl3_modules,
    hf_logits,
    hf_reference_model,
    logits_of,
    module_reference,
    use_torch_attention,
)

from exl3_vllm.kernel import Exl3LinearKernel
from exl3_vllm.linear import Exl3LinearMethod

ARCHS = ["llama_ckpt", "llama_bias_ckpt", "qwen2_ckpt", "qwen3_ckpt"]
TOL = {torch.float32: 1e-3, torch.float16: 2e-3, torch.bfloat16: 8e-3}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
PROMPT = [1, 5, 17, 300, 999, 42, 7, 8, 64, 3]


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.float() - ref).abs().max() / ref.abs().max()).item()


_MODELS: dict = {}


def model_for(request, arch: str, dtype: str):
    key = (arch, dtype)
    if key not in _MODELS:
        path = request.getfixturevalue(arch)
        cfg = engine_config(path, dtype)
        model = build_model(cfg)
        use_torch_attention(model)
        _MODELS[key] = (path, cfg, model)
    return _MODELS[key]


@pytest.fixture(scope="module")
def tensors_of(request):
    cache = {}

    def get(path):
        if path not in cache:
            cache[path] = checkpoint_tensors(path)
        return cache[path]

    return get


@pytest.mark.parametrize("arch", ARCHS)
def test_every_linear_is_exl3(request, dist, arch):
    path, _, model = model_for(request, arch, "bfloat16")
    names = set(exl3_modules(model))
    layers = config_of(path)["num_hidden_layers"]
    expected = {"lm_head"} | {
        f"model.layers.{i}.{m}"
        for i in range(layers)
        for m in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
    }
    assert names == expected
    assert type(model.model.embed_tokens.quant_method).__name__ == "UnquantizedEmbeddingMethod"
    assert isinstance(model.lm_head.quant_method, Exl3LinearMethod)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("arch", ARCHS)
def test_linear_modules_match_dense(request, dist, tensors_of, arch, dtype):
    path, _, model = model_for(request, arch, dtype)
    hf, tensors = config_of(path), tensors_of(path)
    torch_dtype = DTYPES[dtype]
    gen = torch.Generator().manual_seed(0)
    for name, module in exl3_modules(model).items():
        w, bias = module_reference(name, hf, tensors)
        x = torch.randn(7, w.shape[0], generator=gen).to(torch_dtype)
        if name == "lm_head":
            y = module.quant_method.apply(module, x)
        else:
            y, _ = module(x)
        ref = x.float() @ w + (0 if bias is None else bias)
        assert y.dtype == torch_dtype and y.shape == ref.shape, name
        assert rel_err(y, ref) < TOL[torch_dtype], (name, rel_err(y, ref))


@pytest.mark.parametrize("arch", ARCHS)
def test_mlp_blocks_match_dense(request, dist, tensors_of, arch):
    path, _, model = model_for(request, arch, "bfloat16")
    hf, tensors = config_of(path), tensors_of(path)
    h, inter = hf["hidden_size"], hf["intermediate_size"]
    gen = torch.Generator().manual_seed(1)
    for i, layer in enumerate(model.model.layers):
        p = f"model.layers.{i}.mlp"
        x = torch.randn(5, h, generator=gen).to(torch.bfloat16)
        y = layer.mlp(x)
        xf = x.float()
        act = torch.nn.functional.silu(xf @ dense(tensors, f"{p}.gate_proj", h, inter))
        ref = (act * (xf @ dense(tensors, f"{p}.up_proj", h, inter))) @ dense(tensors, f"{p}.down_proj", inter, h)
        assert rel_err(y, ref) < TOL[torch.bfloat16], (p, rel_err(y, ref))


@pytest.mark.parametrize("arch", ARCHS)
def test_whole_model_matches_transformers(request, dist, tensors_of, arch):
    path, cfg, model = model_for(request, arch, "float32")
    ref = hf_logits(hf_reference_model(path, tensors_of(path)), PROMPT)
    logits = logits_of(model, cfg, PROMPT)
    assert logits.shape == ref.shape
    assert rel_err(logits, ref) < TOL[torch.float32], rel_err(logits, ref)
    assert torch.equal(logits.argmax(-1), ref.argmax(-1))


def test_padded_vocab_logits_are_exactly_zero(request, dist, tensors_of):
    """vocab 1000: vLLM pads the head to 1024 columns; stored columns 1000.. are quantization noise, zeroed by svh."""
    path, _, model = model_for(request, "llama_ckpt", "bfloat16")
    head = model.lm_head
    x = torch.randn(4, 256).to(torch.bfloat16)
    logits = head.quant_method.apply(head, x)
    assert logits.shape == (4, 1024)
    assert torch.count_nonzero(logits[:, 1000:]) == 0
    assert torch.count_nonzero(logits[:, :1000]) > 3900
    stored = checkpoint_tensors(path)["lm_head.svh"]
    assert torch.count_nonzero(stored[1000:]) > 0  # the checkpoint's own pad columns are not zero


@pytest.mark.parametrize("name", ["model.layers.0.self_attn.qkv_proj", "model.layers.0.mlp.gate_up_proj",
                                  "model.layers.0.mlp.down_proj", "lm_head"])
def test_fullgraph_compile_matches_eager(request, dist, name):
    """vLLM compiles the forward with fullgraph=True: apply() must trace without a graph break (the op has a fake
    impl; padding and column selection are static). gate_up (688 of 768 columns kept), down (x zero-extended from
    688 to 768) and lm_head (svh-zeroed pad) cover the glue paths."""
    _, _, model = model_for(request, "llama_ckpt", "bfloat16")
    module = dict(model.named_modules())[name]
    method = module.quant_method

    def forward(x):
        return method.apply(module, x, getattr(module, "bias", None))

    torch._dynamo.reset()
    compiled = torch.compile(forward, fullgraph=True, backend="aot_eager")
    x = torch.randn(3, method.layout.k_in).to(torch.bfloat16)
    assert torch.equal(compiled(x), forward(x))


def test_one_op_per_module(request, dist, monkeypatch):
    """apply() issues exactly one exl3_kernels.linear per module, with one trellis per shard (mixed K: 4/3/5)."""
    _, _, model = model_for(request, "llama_ckpt", "bfloat16")
    qkv = model.model.layers[0].self_attn.qkv_proj
    calls = []
    real = torch.ops.exl3_kernels.linear

    class Spy:
        def __call__(self, x, trellis, suh, svh, bias, codebook):
            calls.append([tuple(t.shape) for t in trellis])
            return real(x, trellis, suh, svh, bias, codebook)

    monkeypatch.setattr(torch.ops.exl3_kernels, "linear", Spy())
    qkv(torch.randn(2, 256).to(torch.bfloat16))
    assert calls == [[(16, 16, 64), (16, 8, 48), (16, 8, 80)]]


def test_can_implement_reports_why(request, dist):
    _, _, model = model_for(request, "llama_ckpt", "bfloat16")
    layout = model.lm_head.quant_method.layout
    assert Exl3LinearKernel.can_implement(layout) == (True, None)
