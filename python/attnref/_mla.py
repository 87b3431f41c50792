"""Layer 1, MLA: MlaPreprocess, MLA attention, the MLA cache write."""

__all__ = []
