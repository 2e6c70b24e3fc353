"""Helpers for the exl3-vllm CPU tests (a uniquely named module: pytest runs in importlib mode, and the TP worker
script imports it too).

The CPU recipe (``../shared/docs/vllm-0.24-plugin-surface.md`` §6): vLLM's CPU platform is forced before any other
vLLM import (:func:`force_cpu_platform`), parallel state runs on gloo, and ``torch.ops.exl3_kernels.linear`` runs
its pure-torch reference. The CUDA wheel of vLLM has no CPU attention kernels (``torch.ops._C`` is absent), so
whole-model forwards replace each ``Attention`` layer's forward with a causal SDPA in torch
(:func:`use_torch_attention`); every other layer is vLLM's own (``custom_ops=["none"]`` selects their
``forward_native``).

References never go through the plugin: dense weights come from ``exl3_kernels.reference.dense_weight`` applied
to the raw checkpoint tensors, trimmed to the config's logical dims, and the whole-model reference is the
``transformers`` implementation of the architecture holding those dense weights.
"""

from __future__ import annotations

import contextlib
import copy
import json
import socket
import types
from pathlib import Path

import torch
import torch.nn.functional as F

TESTS = Path(__file__).resolve().parent


def force_cpu_platform() -> None:
    """Bind vLLM's current platform to the CPU platform (must run before any other vLLM import)."""
    import vllm.platforms
    from vllm.platforms.cpu import CpuPlatform

    vllm.platforms.current_platform = CpuPlatform()


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# -- checkpoints ------------------------------------------------------------------------------------------------


def write_checkpoint(out: Path, preset: str, *, config: dict | None = None, **kwargs) -> Path:
    """An EXL3 checkpoint written by ``exl3_kernels.writer`` (random trellis, realistic scales) from a tiny preset
    with ``config`` fields overridden."""
    from exl3_kernels.writer import presets, write_checkpoint as write

    hf_config = presets.preset(preset)
    hf_config.update(config or {})
    return Path(write(out, hf_config, **kwargs))


def edit_config(path: Path, **fields) -> None:
    """Overwrite fields of ``config.json`` (e.g. to mimic an older converter's ``tie_word_embeddings: true``)."""
    cfg_path = Path(path) / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(fields)
    cfg_path.write_text(json.dumps(cfg, indent=2))


def checkpoint_tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def config_of(path: Path) -> dict:
    return json.loads((Path(path) / "config.json").read_text())


def dense(tensors: dict, key: str, k: int | None = None, n: int | None = None) -> torch.Tensor:
    """fp32 dense W [k, n] (in x out) of EXL3 linear ``key``, trimmed to the logical ``k`` x ``n``."""
    from exl3_kernels.reference import dense_weight

    codebook = "mcg" if f"{key}.mcg" in tensors else "mul1" if f"{key}.mul1" in tensors else "3inst"
    w = dense_weight(tensors[f"{key}.trellis"], tensors[f"{key}.suh"], tensors[f"{key}.svh"], codebook=codebook)
    return w.float()[:k, :n]


def bias_of(tensors: dict, key: str, n: int) -> torch.Tensor | None:
    b = tensors.get(f"{key}.bias")
    return None if b is None else b.float()[:n]


# -- vLLM -----------------------------------------------------------------------------------------------------


def engine_config(path: Path | str, dtype: str = "float32", tp: int = 1, **kwargs):
    """A ``VllmConfig`` for ``path`` through vLLM's own argument path (``EngineArgs.create_engine_config``)."""
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(
        model=str(path),
        skip_tokenizer_init=True,
        max_model_len=128,
        enforce_eager=True,
        dtype=dtype,
        tensor_parallel_size=tp,
        compilation_config={"custom_ops": ["none"]},
        **kwargs,
    ).create_engine_config()


def init_distributed(world_size: int = 1, rank: int = 0, port: int | None = None) -> None:
    """gloo process group + vLLM model-parallel groups (TP = world_size), once per process."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(
            world_size=world_size,
            rank=rank,
            local_rank=rank,
            backend="gloo",
            distributed_init_method=f"tcp://127.0.0.1:{port or free_port()}",
        )
        initialize_model_parallel(tensor_model_parallel_size=world_size)


@contextlib.contextmanager
def tp_coordinates(world: int, rank: int):
    """vLLM's TP group reports ``world`` ranks and this process as ``rank`` while the block runs (needs the TP=1
    state of :func:`init_distributed`).

    Layer and model *construction* read only these two numbers from the group (layer widths, vocab shard indices)
    and run no collective, so construction-time behaviour (layouts, start-up refusals) can be checked in one process
    at degrees whose ranks the machine cannot run (TP=8 on two cores). Forward passes need real ranks
    (``tp_worker.py``).
    """
    from vllm.distributed import parallel_state

    real = parallel_state._TP
    fake = copy.copy(real)
    fake.world_size, fake.rank_in_group = world, rank
    parallel_state._TP = fake
    try:
        yield
    finally:
        parallel_state._TP = real


def build_model(vllm_config):
    """vLLM's full load path: construct the model, load every checkpoint tensor, process weights."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader import get_model

    with set_current_vllm_config(vllm_config):
        return get_model(vllm_config=vllm_config)


def _torch_attention(self, query, key, value, output_shape=None):
    """Causal SDPA over one sequence (no KV cache), GQA by repeating KV heads; rank-local heads under TP."""
    t = query.shape[0]
    q = query.view(t, self.num_heads, self.head_size).transpose(0, 1).float()
    k = key.view(t, self.num_kv_heads, self.head_size).transpose(0, 1).float()
    v = value.view(t, self.num_kv_heads, self.head_size_v).transpose(0, 1).float()
    rep = self.num_heads // self.num_kv_heads
    k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.impl.scale)
    return out.transpose(0, 1).reshape(t, -1).to(query.dtype)


def use_torch_attention(model) -> None:
    """Replace each vLLM ``Attention`` layer's forward by :func:`_torch_attention` (test double: the CUDA wheel
    has no CPU attention kernels)."""
    from vllm.model_executor.layers.attention import Attention

    for module in model.modules():
        if isinstance(module, Attention):
            module.forward = types.MethodType(_torch_attention, module)


def logits_of(model, vllm_config, token_ids: list[int]) -> torch.Tensor:
    """Logits [len(token_ids), vocab] of one prompt (one prefill, positions 0..n-1)."""
    from vllm.config import set_current_vllm_config

    ids = torch.tensor(token_ids)
    with set_current_vllm_config(vllm_config), torch.no_grad():
        hidden = model(ids, torch.arange(len(ids)))
        return model.compute_logits(hidden)


def exl3_modules(model) -> dict[str, torch.nn.Module]:
    """vLLM modules whose quant method is the EXL3 linear method, by name."""
    from exl3_vllm.linear import Exl3LinearMethod

    return {n: m for n, m in model.named_modules() if isinstance(getattr(m, "quant_method", None), Exl3LinearMethod)}


# -- references -------------------------------------------------------------------------------------------------


def module_reference(name: str, hf: dict, tensors: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Dense (W [k, n_out], bias or None) a vLLM module must compute at TP=1, from the checkpoint and config.json.

    The fused modules concatenate their projections in vLLM's order (q, k, v; gate, up); ``lm_head`` is padded with
    zero columns to vLLM's padded vocab (multiple of 64).
    """
    h = hf["hidden_size"]
    heads, kv = hf["num_attention_heads"], hf["num_key_value_heads"]
    hd = hf.get("head_dim") or h // heads
    inter = hf["intermediate_size"]
    parent, _, last = name.rpartition(".")
    if last == "qkv_proj":
        parts = [(f"{parent}.q_proj", heads * hd), (f"{parent}.k_proj", kv * hd), (f"{parent}.v_proj", kv * hd)]
        k = h
    elif last == "gate_up_proj":
        parts = [(f"{parent}.gate_proj", inter), (f"{parent}.up_proj", inter)]
        k = h
    elif last == "o_proj":
        parts, k = [(name, h)], heads * hd
    elif last == "down_proj":
        parts, k = [(name, h)], inter
    elif name == "lm_head":
        vocab = hf["vocab_size"]
        w = dense(tensors, "lm_head", h, vocab)
        padded = -(-vocab // 64) * 64
        return torch.cat([w, torch.zeros(h, padded - vocab)], dim=1), None
    else:
        raise KeyError(name)
    w = torch.cat([dense(tensors, key, k, n) for key, n in parts], dim=1)
    biases = [bias_of(tensors, key, n) for key, n in parts]
    bias = None if biases[0] is None else torch.cat(biases)
    return w, bias


def hf_reference_model(path: Path, tensors: dict):
    """The ``transformers`` model of the checkpoint's architecture (fp32, eager attention) holding the dense
    weights of every EXL3 linear (trimmed to the config's dims) and the checkpoint's unquantized tensors."""
    import transformers
    from exl3_format import load_checkpoint

    ckpt = load_checkpoint(path)
    cfg = config_of(path)
    cfg.pop("quantization_config", None)
    cfg["tie_word_embeddings"] = False
    hf_config = transformers.AutoConfig.for_model(**cfg)
    model = transformers.AutoModelForCausalLM.from_config(hf_config, torch_dtype=torch.float32,
                                                          attn_implementation="eager")
    state = {}
    for name, t in tensors.items():
        if name.rpartition(".")[0] not in ckpt.linears:
            state[name] = t.float()
    for key, lin in ckpt.linears.items():
        weight = model.get_parameter(f"{key}.weight")
        n, k = weight.shape
        state[f"{key}.weight"] = dense(tensors, key, k, n).T.contiguous()
        if lin.has_bias:
            state[f"{key}.bias"] = bias_of(tensors, key, n)
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    return model.eval()


def hf_logits(model, token_ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0]
