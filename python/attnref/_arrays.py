"""Arrays in and out of the extension module: torch CPU tensors and NumPy arrays, no copies.

Every tensor argument reaches the C++ operators as a NumPy array over the caller's memory. A torch
tensor is viewed as ``Tensor.numpy()`` would view it (bf16, which NumPy lacks, as its uint16 bit
patterns), by the extension module when it is a strided CPU tensor of a type attnref reads;
torch is looked up in ``sys.modules`` only, so it is never imported by attnref and any version
works. Results are returned as the caller's kind: torch tensors when a tensor argument was a torch
tensor, NumPy arrays otherwise.
"""

import sys

import numpy as np

from ._attnref import _torch_view

__all__ = ["to_array", "Converter"]


def _tensor_to_array(torch, x, op, name):
    if not x.is_cpu:
        raise TypeError(
            f"attnref.{op}: {name} is a tensor on '{x.device}'; attnref computes on CPU "
            f"tensors (move it with .cpu())")
    if x.layout is not torch.strided:
        raise TypeError(f"attnref.{op}: {name} is a {x.layout} tensor; a strided one is needed")
    if x.requires_grad:
        x = x.detach()
    if x.dtype is torch.bfloat16:
        return x.view(torch.int16).numpy().view(np.uint16)
    try:
        return x.numpy()
    except TypeError as e:
        raise TypeError(f"attnref.{op}: {name} has dtype {x.dtype}, not supported") from e


def to_array(x, op, name):
    """``x`` as a NumPy array sharing its memory (None stays None).

    Raises TypeError for a tensor off the CPU or of a kind that is not an array.
    """
    if x is None or type(x) is np.ndarray:
        return x
    a = _torch_view(x)  # a CPU torch tensor of a type attnref reads, viewed in C++
    if a is not None:
        return a
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return _tensor_to_array(torch, x, op, name)
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, (list, tuple)):
        return [to_array(e, op, f"{name}[{i}]") for i, e in enumerate(x)]
    if isinstance(x, (int, np.integer)):
        return x
    if hasattr(x, "__array_interface__") or hasattr(x, "__array__"):
        return np.asarray(x)
    raise TypeError(
        f"attnref.{op}: {name} must be a NumPy array or a torch CPU tensor, got {type(x).__name__}")


def _to_tensor(a):
    torch = sys.modules["torch"]
    if a.dtype == np.uint16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


class Converter:
    """One call's conversions: remembers whether the caller passes torch tensors."""

    __slots__ = ("op", "torch")

    def __init__(self, op):
        self.op = op
        self.torch = False

    def __call__(self, x, name):
        if x is None or type(x) is np.ndarray:
            return x
        a = _torch_view(x)
        if a is not None:
            self.torch = True
            return a
        torch = sys.modules.get("torch")
        if torch is not None:
            if isinstance(x, torch.Tensor):
                self.torch = True
                return _tensor_to_array(torch, x, self.op, name)
            if isinstance(x, (list, tuple)) and any(isinstance(e, torch.Tensor) for e in x):
                self.torch = True
        return to_array(x, self.op, name)

    def result(self, a):
        """A NumPy result returned as the caller's kind (tuples element by element)."""
        if isinstance(a, tuple):
            return tuple(self.result(e) for e in a)
        if self.torch and isinstance(a, np.ndarray):
            return _to_tensor(a)
        return a
