#pragma once
/// Umbrella header: everything public in attnref.
#include "attnref/atb/self_attention.hpp"
#include "attnref/atb/self_attention_params.hpp"
#include "attnref/attention/attention.hpp"
#include "attnref/attention/params.hpp"
#include "attnref/attention/variant.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/layout.hpp"
#include "attnref/core/softmax.hpp"
#include "attnref/core/types.hpp"
#include "attnref/core/view.hpp"
#include "attnref/mask/norm_compress.hpp"
#include "attnref/version.hpp"
