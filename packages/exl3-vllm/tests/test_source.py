"""Checkpoint location: local directories as given, hub ids through vLLM's download helper and the HF cache
(offline here: the cache is laid out by hand the way huggingface_hub stores snapshots)."""

from __future__ import annotations

import shutil
import types

import huggingface_hub.constants
import huggingface_hub.errors
import pytest

from exl3_vllm.config import Exl3Config
from exl3_vllm.source import resolve_checkpoint_dir

REPO = "exl3-test/tiny-llama"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_cache(tmp_path, llama_ckpt, monkeypatch):
    cache = tmp_path / "hub"
    repo = cache / ("models--" + REPO.replace("/", "--"))
    snapshot = repo / "snapshots" / COMMIT
    shutil.copytree(llama_ckpt, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return cache, snapshot


def test_local_directory_is_used_as_is(llama_ckpt):
    assert resolve_checkpoint_dir(str(llama_ckpt)) == str(llama_ckpt)


def test_hub_id_resolves_to_the_cached_snapshot(hub_cache):
    cache, snapshot = hub_cache
    assert resolve_checkpoint_dir(REPO, None, str(cache)) == str(snapshot)


def test_hub_id_is_read_where_the_model_is_built(hub_cache, monkeypatch):
    """vLLM's maybe_update_config gets no revision nor --download-dir, so a hub id waits for the process that builds
    the model, where the current vLLM config has both."""
    import vllm.config

    cache, _ = hub_cache
    qc = Exl3Config({"quant_method": "exl3"})
    qc.maybe_update_config(REPO, hf_config=types.SimpleNamespace(tie_word_embeddings=False))
    assert qc.checkpoint is None
    current = types.SimpleNamespace(
        model_config=types.SimpleNamespace(model=REPO, revision=COMMIT, hf_config=None),
        load_config=types.SimpleNamespace(download_dir=str(cache)),
    )
    monkeypatch.setattr(vllm.config, "get_current_vllm_config", lambda: current)
    assert len(qc.claims.checkpoint.linears) == 15
    assert (qc.model_name, qc.revision) == (REPO, COMMIT)


def test_unknown_hub_id_fails_offline(tmp_path, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(huggingface_hub.errors.LocalEntryNotFoundError, match=r"Cannot find an appropriate cached"):
        resolve_checkpoint_dir("exl3-test/absent", None, str(tmp_path / "empty-cache"))
