"""Arrays in and out of the extension module: torch CPU tensors and NumPy arrays, no copies.

Every tensor argument reaches the C++ operators as a NumPy array over the caller's memory. A torch
tensor is viewed through ``Tensor.numpy()`` (bf16, which NumPy lacks, as its uint16 bit patterns);
torch is looked up in ``sys.modules`` only, so it is never imported by attnref and any version
works. Results are returned as the caller's kind: torch tensors when a tensor argument was a torch
tensor, NumPy arrays otherwise.
"""

import sys

import numpy as np

__all__ = ["to_array", "Converter"]


def _torch():
    return sys.modules.get("torch")


def _is_tensor(x):
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def to_array(x, op, name):
    """``x`` as a NumPy array sharing its memory (None stays None).

    Raises TypeError for a tensor off the CPU or of a kind that is not an array.
    """
    if x is None or isinstance(x, np.ndarray):
        return x
    if _is_tensor(x):
        torch = _torch()
        if x.device.type != "cpu":
            raise TypeError(
                f"attnref.{op}: {name} is a tensor on '{x.device}'; attnref computes on CPU "
                f"tensors (move it with .cpu())")
        if x.layout != torch.strided:
            raise TypeError(f"attnref.{op}: {name} is a {x.layout} tensor; a strided one is needed")
        x = x.detach()
        if x.dtype == torch.bfloat16:
            return x.view(torch.int16).numpy().view(np.uint16)
        try:
            return x.numpy()
        except TypeError as e:
            raise TypeError(f"attnref.{op}: {name} has dtype {x.dtype}, not supported") from e
    if isinstance(x, (list, tuple)):
        return [to_array(e, op, f"{name}[{i}]") for i, e in enumerate(x)]
    if isinstance(x, (int, np.integer)):
        return x
    if hasattr(x, "__array_interface__") or hasattr(x, "__array__"):
        return np.asarray(x)
    raise TypeError(
        f"attnref.{op}: {name} must be a NumPy array or a torch CPU tensor, got {type(x).__name__}")


def _to_tensor(a):
    torch = _torch()
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
        if x is not None and not isinstance(x, np.ndarray):
            if _is_tensor(x) or (isinstance(x, (list, tuple)) and any(_is_tensor(e) for e in x)):
                self.torch = True
        return to_array(x, self.op, name)

    def result(self, a):
        """A NumPy result returned as the caller's kind (tuples element by element)."""
        if isinstance(a, tuple):
            return tuple(self.result(e) for e in a)
        if self.torch and isinstance(a, np.ndarray):
            return _to_tensor(a)
        return a
