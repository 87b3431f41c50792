"""torch_npu's NSA calls."""

__all__ = []
