"""TP=2 on gloo with two processes (``tp_worker.py``) against TP=1 in this process and the dense reference.

The TP checkpoint is a Qwen2-shaped model chosen to hit every TP path at once: q/k/v with biases and mixed K
(k_proj K=2.5, v_proj K=5), 2 KV heads of 64 at TP=2 (one head per rank, not a whole 128-block: every rank holds
the whole k/v tensor and keeps its head's columns), MLP 512 (256 per rank), and vocab 1100, which vLLM pads to
1152 = 2 x 576: rank 1's slice starts at 576, off the 128 grid, so it computes blocks [512, 1152) and keeps 576
of those columns. The refused checkpoint is the tiny Llama, whose MLP of 688 (768 stored) would be cut at 344.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from exl3_vllm_testutil import TESTS, build_model, config_of, engine_config, exl3_modules, free_port, logits_of
from exl3_vllm_testutil import checkpoint_tensors, module_reference, use_torch_attention

PROMPT = [1, 5, 17, 300, 999, 42, 7, 8, 64, 3]
WORLD = 2


@pytest.fixture(scope="module")
def tp_ckpt(ckpt_dir):
    return ckpt_dir("qwen2-tp", "tiny_qwen2", config={"vocab_size": 1100},
                    overrides={"*.k_proj": 2.5, "*.v_proj": 5}, codebook="mul1")


@pytest.fixture(scope="module")
def tp_run(tmp_path_factory, tp_ckpt, llama_ckpt):
    out = tmp_path_factory.mktemp("tp2")
    port = free_port()
    env = dict(os.environ, VLLM_LOGGING_LEVEL="WARNING")
    procs = [
        subprocess.Popen(
            [sys.executable, str(TESTS / "tp_worker.py"), str(rank), str(WORLD), str(port), str(out),
             str(tp_ckpt), str(llama_ckpt)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for rank in range(WORLD)
    ]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    for rank, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {rank} failed:\n{log[-4000:]}"
    return torch.load(out / "rank0.pt", weights_only=False)


def _tp1_layout(gathered: torch.Tensor, widths: list[int]) -> torch.Tensor:
    """Column outputs gathered from the ranks ([rank0: s0 s1 .. | rank1: ..]) reordered to TP=1's [s0 | s1 | ..]."""
    per_rank = gathered.split(sum(widths), dim=-1)
    shards = [torch.cat([r.split(widths, dim=-1)[s] for r in per_rank], dim=-1) for s in range(len(widths))]
    return torch.cat(shards, dim=-1)


def test_tp2_modules_equal_tp1_and_dense(tp_run, tp_ckpt, dist):
    cfg = engine_config(tp_ckpt, "float32")
    tp1 = exl3_modules(build_model(cfg))
    hf, tensors = config_of(tp_ckpt), checkpoint_tensors(tp_ckpt)
    kinds = set()
    for name, rec in tp_run["modules"].items():
        kinds.add(rec["kind"])
        x = rec["x"]
        y2 = rec["y"] if rec["kind"] == "row" else _tp1_layout(rec["y"], rec["widths"])
        module = tp1[name]
        y1 = module.quant_method.apply(module, x) if name == "lm_head" else module(x)[0]
        assert y2.shape == y1.shape, name
        # same math per column; only the fp32 summation order differs (row: gloo all-reduce of partial sums)
        assert ((y2 - y1).abs().max() / y1.abs().max()).item() < 1e-5, (name, rec["layout"])
        w, bias = module_reference(name, hf, tensors)
        ref = x @ w + (0 if bias is None else bias)
        assert ((y2 - ref).abs().max() / ref.abs().max()).item() < 1e-3, (name, rec["layout"])
    assert kinds == {"column", "row", "lm_head"}


def test_tp2_layouts_take_the_block_fallbacks(tp_run):
    mods = tp_run["modules"]
    # rank 0's view: k/v keep their head's columns of the whole 128-column tensor
    assert "k_proj<-model.layers.0.self_attn.k_proj K=2.5 rows[0:256] cols[0:128] select[0:64]" in (
        mods["model.layers.0.self_attn.qkv_proj"]["layout"]
    )
    assert mods["lm_head"]["widths"] == [576]
    assert mods["lm_head"]["y"].shape[-1] == 1152
    assert torch.count_nonzero(mods["lm_head"]["y"][:, 1100:]) == 0


def test_tp2_whole_model_equals_tp1(tp_run, tp_ckpt, dist):
    cfg = engine_config(tp_ckpt, "float32")
    model = build_model(cfg)
    use_torch_attention(model)
    tp1 = logits_of(model, cfg, PROMPT)
    tp2 = tp_run["logits"]
    assert tp2.shape == tp1.shape == (len(PROMPT), 1100)
    assert ((tp2 - tp1).abs().max() / tp1.abs().max()).item() < 1e-5


def test_tp_degree_not_admitted_is_refused_before_loading(tp_run):
    msg = tp_run["refusal"]
    assert msg is not None
    assert "model.layers.0.mlp.gate_up_proj" in msg and "model.layers.0.mlp.gate_proj" in msg
    assert "tensor parallel size 2" in msg and "344" in msg and "128" in msg and "Hadamard" in msg
    assert tp_run["loads_before_refusal"] == 0
