"""vLLM plugin for EXL3."""
