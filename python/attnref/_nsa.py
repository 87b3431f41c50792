"""Layer 1, NSA: the Native Sparse Attention operators."""

__all__ = []
