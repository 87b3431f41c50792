"""attnref: the CPU reference of the Ascend attention operators, from Python.

Layer 1 (this module): attnref's operators by their C++ names, e.g.
``attnref.paged_attention(query=..., key_cache=..., ..., num_heads=32, qk_scale=0.088)``, on NumPy
arrays or torch CPU tensors, returning the caller's kind. Layer 2 (``attnref.torch_npu``): the
torch_npu calls of serving stacks, names, arguments and in-place semantics included.

Errors: a wrong shape or parameter raises ValueError, an index (block table, slot mapping) out of
range IndexError, a wrong dtype, device or kind of object TypeError; every message names the
argument. See docs/python.md.
"""

from . import _attnref
from ._attnref import ExecConfig, SimdLevel, compiled_simd_level, set_simd_level, simd_level
from ._atb import *  # noqa: F401,F403
from ._cann import *  # noqa: F401,F403
from ._mla import *  # noqa: F401,F403
from ._nsa import *  # noqa: F401,F403
from ._dsa import *  # noqa: F401,F403
from . import _atb, _cann, _dsa, _mla, _nsa

__version__ = _attnref.__version__

__all__ = (["ExecConfig", "SimdLevel", "compiled_simd_level", "set_simd_level", "simd_level"] +
           _atb.__all__ + _cann.__all__ + _mla.__all__ + _nsa.__all__ + _dsa.__all__)
