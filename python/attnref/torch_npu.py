"""Layer 2: torch_npu's attention calls, names, arguments and in-place semantics included.

``import attnref.torch_npu as torch_npu`` lets an attention backend written for the NPU run
unchanged on CPU tensors: each function here has the torch_npu name, argument names, order and
defaults, writes the caller's ``out`` / caches in place where torch_npu does, and returns what
torch_npu returns. What each call maps onto, supports and rejects: docs/python.md.

Arguments torch_npu reads on the host (``seq_len``, ``context_lens``: CPU int32 tensors) must be
int32 here too; an argument torch_npu requires as a tensor is required as an array or tensor.
Errors are raised as in layer 1 (ValueError, IndexError, TypeError), the message naming the
torch_npu argument.
"""

from ._npu_atb import *  # noqa: F401,F403
from ._npu_cann import *  # noqa: F401,F403
from ._npu_mla import *  # noqa: F401,F403
from ._npu_nsa import *  # noqa: F401,F403
from ._npu_dsa import *  # noqa: F401,F403
from . import _npu_atb, _npu_cann, _npu_dsa, _npu_mla, _npu_nsa

__all__ = (_npu_atb.__all__ + _npu_cann.__all__ + _npu_mla.__all__ + _npu_nsa.__all__ +
           _npu_dsa.__all__)
