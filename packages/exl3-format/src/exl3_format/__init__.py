"""EXL3 checkpoint format (pure Python)."""
