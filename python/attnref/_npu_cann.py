"""torch_npu's CANN calls."""

__all__ = []
