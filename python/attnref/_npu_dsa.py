"""torch_npu's DSA calls."""

__all__ = []
