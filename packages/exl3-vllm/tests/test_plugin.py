"""The plugin is found through its entry point and ``quant_method: "exl3"`` in config.json selects it."""

from __future__ import annotations

import importlib.metadata
import shutil

import pytest
import torch
from exl3_vllm_testutil import config_of, edit_config, engine_config

from exl3_vllm import plugin
from exl3_vllm.config import Exl3Config


def test_entry_point_is_installed():
    eps = [ep for ep in importlib.metadata.entry_points(group="vllm.general_plugins") if ep.name == "exl3"]
    assert len(eps) == 1
    assert eps[0].value == "exl3_vllm.plugin:register"
    assert eps[0].load() is plugin.register


def test_register_is_idempotent():
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, get_quantization_config

    plugin.register()
    plugin.register()
    assert QUANTIZATION_METHODS.count("exl3") == 1
    assert get_quantization_config("exl3") is Exl3Config
    assert hasattr(torch.ops.exl3_kernels, "linear")


def test_override_quantization_method():
    override = Exl3Config.override_quantization_method
    assert override({"quant_method": "exl3"}, None) == "exl3"
    assert override({"quant_method": "EXL3"}, "exl3") == "exl3"
    assert override({"quant_method": "exl3"}, "fp8") is None  # vLLM then reports the mismatch
    assert override({"quant_method": "gptq"}, None) is None


def test_config_json_selects_exl3(llama_ckpt):
    cfg = engine_config(llama_ckpt, "bfloat16")
    assert cfg.model_config.quantization == "exl3"
    qc = cfg.quant_config
    assert isinstance(qc, Exl3Config)
    assert qc.bits == config_of(llama_ckpt)["quantization_config"]["bits"]
    assert len(qc.checkpoint.linears) == 15  # headers read at config time (maybe_update_config)
    assert engine_config(llama_ckpt, "bfloat16", quantization="exl3").model_config.quantization == "exl3"


def test_upper_case_quant_method_is_selected(llama_ckpt, tmp_path):
    path = tmp_path / "upper"
    shutil.copytree(llama_ckpt, path)
    qc = config_of(path)["quantization_config"]
    edit_config(path, quantization_config={**qc, "quant_method": "EXL3"})
    assert engine_config(path, "bfloat16").model_config.quantization == "exl3"


def test_other_user_quantization_is_a_mismatch(llama_ckpt):
    with pytest.raises(ValueError, match=r"does not match"):
        engine_config(llama_ckpt, "bfloat16", quantization="fp8")


def test_dtypes_and_capability():
    qc = Exl3Config({"quant_method": "exl3"})
    assert qc.get_name() == "exl3"
    assert {torch.float16, torch.bfloat16} <= set(qc.get_supported_act_dtypes())
    assert Exl3Config.get_min_capability() == 80
    assert Exl3Config.get_config_filenames() == ["quantization_config.json"]


def test_checkpoint_found_without_maybe_update_config(llama_ckpt, dist):
    """Worker-side fallback: a config vLLM did not update reads the checkpoint of the current vLLM config."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.linear import RowParallelLinear

    from exl3_vllm.linear import Exl3LinearMethod

    qc = Exl3Config(config_of(llama_ckpt)["quantization_config"])
    with set_current_vllm_config(engine_config(llama_ckpt)):
        layer = RowParallelLinear(256, 256, bias=False, quant_config=qc, prefix="model.layers.0.self_attn.o_proj")
    assert isinstance(layer.quant_method, Exl3LinearMethod)
    assert qc.checkpoint is not None and qc.model_name == str(llama_ckpt)
    assert tuple(layer.trellis.shape) == (16 * 16 * 64,) and layer.trellis.dtype == torch.int16


def test_kernel_logs_go_through_vllm_handlers(monkeypatch):
    """The autotuner's INFO lines reach vLLM's handler (they were dropped: exl3_kernels has no handler of its own)."""
    import logging

    from exl3_vllm.plugin import route_kernel_logs

    kernels, vllm_log = logging.getLogger("exl3_kernels"), logging.getLogger("vllm")
    records: list[logging.LogRecord] = []

    class Catch(logging.Handler):
        def emit(self, record):
            records.append(record)

    catch = Catch()
    monkeypatch.setattr(kernels, "handlers", [])
    monkeypatch.setattr(kernels, "propagate", True)
    monkeypatch.setattr(kernels, "level", logging.NOTSET)
    monkeypatch.setattr(vllm_log, "handlers", [catch])
    monkeypatch.setattr(vllm_log, "level", logging.INFO)
    route_kernel_logs()
    logging.getLogger("exl3_kernels.autotune").info("exl3 autotune: primed %d m buckets", 3)
    logging.getLogger("exl3_kernels.autotune").debug("not at INFO")
    assert [r.getMessage() for r in records] == ["exl3 autotune: primed 3 m buckets"]
    assert kernels.propagate is False
    # an application that configured exl3_kernels itself is left alone
    mine = Catch()
    monkeypatch.setattr(kernels, "handlers", [mine])
    route_kernel_logs()
    assert kernels.handlers == [mine]
