"""Where the checkpoint of a ``vllm serve <model>`` lives on disk, and its headers.

``<model>`` is a local directory or a Hugging Face hub id. For a hub id the safetensors files and JSON files are
fetched the way vLLM fetches them for loading (``vllm.model_executor.model_loader.weight_utils``
``download_weights_from_hf``: file lock per model, ``HF_HUB_OFFLINE`` honoured, the index file narrows the shard
list), into the same cache, so the later weight load finds them there. ModelScope ids
(``VLLM_USE_MODELSCOPE``) go through vLLM's ``maybe_download_from_modelscope``.
"""

from __future__ import annotations

import os

from exl3_format import Checkpoint, load_checkpoint

__all__ = ["load_model_checkpoint", "resolve_checkpoint_dir"]


def resolve_checkpoint_dir(model: str, revision: str | None = None, download_dir: str | None = None) -> str:
    """Local directory holding the checkpoint's safetensors and JSON files.

    Args:
        model: a local directory, or a hub id.
        revision: hub revision (branch, tag or commit); None for the default branch.
        download_dir: vLLM's ``--download-dir`` (HF cache directory); None for the HF default.

    Returns:
        ``model`` itself when it is a directory, else the hub snapshot directory.

    Raises:
        Whatever huggingface_hub raises for an unknown repo, or for a repo missing from the cache when offline.
    """
    if os.path.isdir(model):
        return model
    from vllm.model_executor.model_loader.weight_utils import (
        download_weights_from_hf,
        maybe_download_from_modelscope,
    )

    local = maybe_download_from_modelscope(model, revision, download_dir)
    if local is not None and os.path.isdir(local):
        return local
    folder = download_weights_from_hf(model, download_dir, ["*.safetensors"], revision)
    # config.json / quantization_config.json / the index, into the same snapshot
    download_weights_from_hf(model, download_dir, ["*.json"], revision)
    return folder


def load_model_checkpoint(model: str, revision: str | None = None, download_dir: str | None = None) -> Checkpoint:
    """The checkpoint headers of ``model`` (see :func:`resolve_checkpoint_dir`).

    Raises:
        exl3_format.Exl3FormatError: the checkpoint is malformed (the message names the file and tensor).
    """
    return load_checkpoint(resolve_checkpoint_dir(model, revision, download_dir))
