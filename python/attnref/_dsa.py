"""Layer 1, DSA: LightningIndexer, SparseFlashAttention."""

__all__ = []
