#pragma once
/// The CANN combinations of the Python module's second unit (compile time), in one list:
/// cann_quant.cpp instantiates them (ATTNREF_CANN_EXTERN empty) and cann.cpp, which binds them,
/// declares them (ATTNREF_CANN_EXTERN `extern`) so as not to instantiate them again: the float32
/// operators (attnref extension) and int8 key / value with a float16 or bfloat16 query
/// (antiquant). Define ATTNREF_CANN_EXTERN before including this file.

#include <attnref/cann/fused_infer_attention_score.hpp>
#include <attnref/cann/incre_flash_attention.hpp>
#include <attnref/cann/prompt_flash_attention.hpp>

namespace attnref {

#define ATTNREF_CANN_PFA(T)                                                                     \
  ATTNREF_CANN_EXTERN template void prompt_flash_attention<T, std::uint8_t, T, T>(              \
      const PromptFlashAttentionParams&, const PromptFlashAttentionInputs<T, std::uint8_t, T>&, \
      const PromptFlashAttentionOutputs<T>&, const ExecConfig&);
#define ATTNREF_CANN_IFA(T, TKV)                                                    \
  ATTNREF_CANN_EXTERN template void incre_flash_attention<T, TKV, std::uint8_t, T>( \
      const IncreFlashAttentionParams&, const IncreFlashAttentionInputs<T, TKV>&,   \
      const IncreFlashAttentionOutputs<T>&, const ExecConfig&);
#define ATTNREF_CANN_FIA(T, TKV)                                                             \
  ATTNREF_CANN_EXTERN template void fused_infer_attention_score<T, TKV, std::uint8_t, T, T>( \
      const FusedInferAttentionScoreParams&, const FusedInferAttentionScoreInputs<T, TKV>&,  \
      const FusedInferAttentionScoreOutputs<T>&, const ExecConfig&);
ATTNREF_CANN_PFA(float)
ATTNREF_CANN_IFA(float, float)
ATTNREF_CANN_IFA(half, std::int8_t)
ATTNREF_CANN_IFA(bfloat16, std::int8_t)
ATTNREF_CANN_FIA(float, float)
ATTNREF_CANN_FIA(half, std::int8_t)
ATTNREF_CANN_FIA(bfloat16, std::int8_t)
#undef ATTNREF_CANN_PFA
#undef ATTNREF_CANN_IFA
#undef ATTNREF_CANN_FIA

}  // namespace attnref
