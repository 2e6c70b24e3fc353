"""vLLM plugin for EXL3 checkpoints (exllamav3's trellis-coded weights): ``vllm serve <exl3 checkpoint>``.

Entry point ``exl3_vllm.plugin:register`` (group ``vllm.general_plugins``) registers the ``exl3`` quantization
config. See ``docs/vllm-plugin.md``.
"""

__version__ = "0.1.0"
