"""TP=2 and TP=4 on gloo (``tp_worker.py`` forks the ranks) against TP=1 in this process and the dense reference;
refusal of degrees a checkpoint does not admit, at TP=2/4 in real ranks and at TP=4/8 in this process.

The TP checkpoint is a Qwen2-shaped model whose every split dimension is a multiple of 512 = 128 x 4, chosen to
hit every TP path at both degrees: q/k/v with biases and mixed K (k_proj K=2.5, v_proj K=5); 8 attention heads of
64 (4 per rank at TP=2, 2 = one 128-block at TP=4); 2 KV heads of 64 (one per rank at TP=2, each replicated on
two ranks at TP=4: a head is half a 128-block, so every rank holds the whole k/v tensor and keeps its head's
columns); MLP 1024 (512 / 256 per rank); and vocab 1030, stored as 1152 (pad128) but padded by vLLM to 1088
(pad64): 544 per rank at TP=2 and 272 at TP=4, so every inner slice boundary is off the 128 grid and the last
rank computes stored columns past vLLM's padded vocab.

The committed real checkpoints (``tests/data/exl3``: hidden 256, 4 heads of 64, MLP 768) do not admit TP=4: q_proj
puts a rank boundary at 64 (one head of 64 per rank) and gate/up/down split 768 into 192-column slices; they
admit TP=2, which is run on the GPU machine.

The refused checkpoint is the tiny Llama (4 heads of 64, MLP 688 stored as 768): at TP=2 its gate_proj would be
cut at 344, at TP=4 its q_proj at 64.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from exl3_vllm_testutil import TESTS, build_model, config_of, engine_config, exl3_modules, logits_of
from exl3_vllm_testutil import checkpoint_tensors, module_reference, tp_coordinates, use_torch_attention

PROMPT = [1, 5, 17, 300, 999, 42, 7, 8, 64, 3]
DEGREES = (2, 4)
VOCAB = 1030


@pytest.fixture(scope="module")
def tp_ckpt(ckpt_dir):
    return ckpt_dir("qwen2-tp4", "tiny_qwen2",
                    config={"hidden_size": 512, "num_attention_heads": 8, "intermediate_size": 1024,
                            "vocab_size": VOCAB},
                    overrides={"*.k_proj": 2.5, "*.v_proj": 5}, codebook="mul1")


@pytest.fixture(scope="module")
def tp_runs(tmp_path_factory, tp_ckpt, llama_ckpt):
    """Both degrees from one launcher (it imports vLLM once): ``{tp: [rank0 result, rank1 result, ...]}``."""
    out = tmp_path_factory.mktemp("tp")
    env = dict(os.environ, VLLM_LOGGING_LEVEL="WARNING")
    proc = subprocess.run(
        [sys.executable, str(TESTS / "tp_worker.py"), str(out), str(tp_ckpt), str(llama_ckpt),
         *map(str, DEGREES)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600,
    )
    assert proc.returncode == 0, f"TP ranks failed:\n{proc.stdout[-8000:]}"
    return {tp: [torch.load(out / f"tp{tp}" / f"rank{r}.pt", weights_only=False) for r in range(tp)]
            for tp in DEGREES}


@pytest.fixture(params=DEGREES, ids=lambda tp: f"tp{tp}")
def tp(request):
    return request.param


@pytest.fixture(scope="module")
def tp1(tp_ckpt, dist):
    """The TP=1 model of the TP checkpoint in this process (torch attention) and its config."""
    cfg = engine_config(tp_ckpt, "float32")
    model = build_model(cfg)
    use_torch_attention(model)
    return model, cfg


def _tp1_layout(gathered: torch.Tensor, widths: list[int], replicas: list[int]) -> torch.Tensor:
    """Column outputs gathered from the ranks ([rank0: s0 s1 .. | rank1: ..]) reordered to TP=1's [s0 | s1 | ..].

    Shard s is replicated on ``replicas[s]`` consecutive ranks (vLLM's KV heads when tp > num_kv_heads); the
    replicas must agree exactly, and one of each is kept.
    """
    per_rank = [r.split(widths, dim=-1) for r in gathered.split(sum(widths), dim=-1)]
    shards = []
    for s, rep in enumerate(replicas):
        pieces = [r[s] for r in per_rank]
        for i in range(0, len(pieces), rep):
            assert all(torch.equal(pieces[i], p) for p in pieces[i : i + rep]), f"shard {s}: replicas differ"
        shards.append(torch.cat(pieces[::rep], dim=-1))
    return torch.cat(shards, dim=-1)


def test_modules_equal_tp1_and_dense(tp_runs, tp, tp1, tp_ckpt):
    model, _ = tp1
    modules = exl3_modules(model)
    hf, tensors = config_of(tp_ckpt), checkpoint_tensors(tp_ckpt)
    kv_replicas = max(1, tp // hf["num_key_value_heads"])
    rank0 = tp_runs[tp][0]
    kinds = set()
    for name, rec in rank0["modules"].items():
        kinds.add(rec["kind"])
        x = rec["x"]
        replicas = [1, kv_replicas, kv_replicas] if name.endswith("qkv_proj") else [1] * len(rec["widths"])
        y_tp = rec["y"] if rec["kind"] == "row" else _tp1_layout(rec["y"], rec["widths"], replicas)
        module = modules[name]
        with torch.no_grad():
            y1 = module.quant_method.apply(module, x) if name == "lm_head" else module(x)[0]
        assert y_tp.shape == y1.shape, name
        # same math per column; only the fp32 summation order differs (row: gloo all-reduce of partial sums)
        assert ((y_tp - y1).abs().max() / y1.abs().max()).item() < 1e-5, (name, rank0["layouts"][name])
        w, bias = module_reference(name, hf, tensors)
        ref = x @ w + (0 if bias is None else bias)
        assert ((y_tp - ref).abs().max() / ref.abs().max()).item() < 1e-3, (name, rank0["layouts"][name])
    assert kinds == {"column", "row", "lm_head"}
    assert len(rank0["modules"]) == 2 * 4 + 1  # qkv, o, gate_up, down per layer, and lm_head


# Per degree and rank: (q, k) of layer 0's qkv_proj and lm_head as ``ShardLayout`` descriptions.
QKV = "model.layers.0.self_attn.qkv_proj"
EXPECTED = {
    2: {
        QKV: ["q_proj<-model.layers.0.self_attn.q_proj K=4 rows[0:512] cols[{}] select[0:256]",
              "k_proj<-model.layers.0.self_attn.k_proj K=2.5 rows[0:512] cols[0:128] select[{}]"],
        "q": ["0:256", "256:512"],
        "k": ["0:64", "64:128"],
        # vLLM slices [0, 544), [544, 1088); covering blocks [0, 640), [512, 1152)
        "lm_head": ["cols[0:640] select[0:544]", "cols[512:1152] select[32:576]"],
    },
    4: {
        QKV: ["q_proj<-model.layers.0.self_attn.q_proj K=4 rows[0:512] cols[{}] select[0:128]",
              "k_proj<-model.layers.0.self_attn.k_proj K=2.5 rows[0:512] cols[0:128] select[{}]"],
        "q": ["0:128", "128:256", "256:384", "384:512"],
        "k": ["0:64", "0:64", "64:128", "64:128"],
        # vLLM slices of 272: [0, 272) .. [816, 1088); covering blocks
        "lm_head": ["cols[0:384] select[0:272]", "cols[256:640] select[16:288]", "cols[512:896] select[32:304]",
                    "cols[768:1152] select[48:320]"],
    },
}


def test_layouts_take_the_block_fallbacks(tp_runs, tp):
    expected = EXPECTED[tp]
    q_fmt, k_fmt = expected[QKV]
    for rank, result in enumerate(tp_runs[tp]):
        qkv = result["layouts"][QKV]
        assert q_fmt.format(expected["q"][rank]) in qkv, qkv
        assert k_fmt.format(expected["k"][rank]) in qkv, qkv
        assert expected["lm_head"][rank] in result["layouts"]["lm_head"], result["layouts"]["lm_head"]
    lm_head = tp_runs[tp][0]["modules"]["lm_head"]
    assert lm_head["widths"] == [1088 // tp]
    assert lm_head["y"].shape[-1] == 1088
    # columns >= the vocab have svh = 0 on whichever rank computes them: exactly zero logits
    assert torch.count_nonzero(lm_head["y"][:, VOCAB:]) == 0
    assert torch.count_nonzero(lm_head["y"][:, :VOCAB]) == lm_head["y"][:, :VOCAB].numel()


def test_whole_model_equals_tp1(tp_runs, tp, tp1):
    model, cfg = tp1
    ref = logits_of(model, cfg, PROMPT)
    logits = tp_runs[tp][0]["logits"]
    assert logits.shape == ref.shape == (len(PROMPT), VOCAB)
    assert ((logits - ref).abs().max() / ref.abs().max()).item() < 1e-5


REFUSALS = {
    2: ("model.layers.0.mlp.gate_up_proj: tensor parallel size 2 is not admitted by checkpoint linear "
        "model.layers.0.mlp.gate_proj: column split of n=688 (stored 768) at TP=2 puts a rank boundary at 344, not a "
        "multiple of 128 (every rank must hold whole 128-wide Hadamard blocks)"),
    4: ("model.layers.0.self_attn.qkv_proj: tensor parallel size 4 is not admitted by checkpoint linear "
        "model.layers.0.self_attn.q_proj: column split of n=256 (4 heads of 64) at TP=4 puts a rank boundary at 64, "
        "not a multiple of 128 (every rank must hold whole 128-wide Hadamard blocks)"),
}


def test_tp_degree_not_admitted_is_refused_before_loading(tp_runs, tp):
    for result in tp_runs[tp]:
        assert result["refusal"].startswith(REFUSALS[tp])
        assert f"exl3-inspect --tp {tp} <checkpoint>" in result["refusal"]
        assert result["loads_before_refusal"] == 0


def _refusal(path, world: int, rank: int, monkeypatch) -> tuple[str, int]:
    from exl3_vllm.errors import Exl3VllmError
    from exl3_vllm.loader import Exl3WeightLoader

    calls = []
    real_call = Exl3WeightLoader.__call__
    monkeypatch.setattr(Exl3WeightLoader, "__call__",
                        lambda self, *a, **k: (calls.append(1), real_call(self, *a, **k))[1])
    with tp_coordinates(world, rank), pytest.raises(Exl3VllmError) as info:
        build_model(engine_config(path, "float32", tp=world))
    return str(info.value), len(calls)


@pytest.mark.parametrize("rank", [0, 3])
def test_tp4_refusal_in_process_matches_the_real_ranks(llama_ckpt, dist, rank, monkeypatch):
    message, loads = _refusal(llama_ckpt, 4, rank, monkeypatch)
    assert message.startswith(REFUSALS[4]) and loads == 0


@pytest.mark.parametrize("rank", [0, 7])
def test_tp8_refused_before_loading(tp_ckpt, dist, rank, monkeypatch):
    """The TP checkpoint admits TP=4, not TP=8: one head of 64 per rank is half a 128-block."""
    message, loads = _refusal(tp_ckpt, 8, rank, monkeypatch)
    assert message.startswith(
        "model.layers.0.self_attn.qkv_proj: tensor parallel size 8 is not admitted by checkpoint linear "
        "model.layers.0.self_attn.q_proj: column split of n=512 (8 heads of 64) at TP=8 puts a rank boundary at 64, "
        "not a multiple of 128 (every rank must hold whole 128-wide Hadamard blocks); "
        "`exl3-inspect --tp 8 <checkpoint>` lists every module"
    )
    assert loads == 0
