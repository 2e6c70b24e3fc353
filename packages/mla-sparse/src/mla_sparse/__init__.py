"""Sparse-MLA decode kernels."""
