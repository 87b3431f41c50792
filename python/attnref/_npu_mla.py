"""torch_npu's MLA calls."""

__all__ = []
