"""Layer 1, CANN: PromptFlashAttention, IncreFlashAttention, FusedInferAttentionScore."""

__all__ = []
