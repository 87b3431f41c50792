"""Layer 1: attnref's operators by their C++ names, on NumPy arrays or torch CPU tensors.

Each operator takes its tensors as keyword arguments named like the C++ input fields, its
parameters either as a params object or as keyword arguments named like the params fields (or
both: the keywords override a copy of the object), and ``exec`` (an ExecConfig) or ``threads``.
An output left out is allocated; one passed as ``out=`` is written in place and returned.
"""

import copy

from . import _attnref
from ._arrays import Converter

_OPTIONS = ("exec", "threads")


def _exec_config(op, exec, threads):
    if exec is None:
        exec = _attnref.ExecConfig()
    elif not isinstance(exec, _attnref.ExecConfig):
        raise TypeError(f"attnref.{op}: exec must be an attnref.ExecConfig")
    if threads is not None:
        exec = copy.copy(exec)
        exec.threads = threads
    return exec


def _params(op, cls, params, fields):
    if params is None:
        params = cls()
    elif not isinstance(params, cls):
        raise TypeError(f"attnref.{op}: params must be an attnref.{cls.__name__}, "
                        f"got {type(params).__name__}")
    if fields:
        params = copy.copy(params)
        for k, v in fields.items():
            setattr(params, k, v)
    return params


def no_exec(impl):
    """An ``impl(tensors)`` that takes no ExecConfig (the copy operators) as ``impl(tensors, exec)``."""
    return lambda tensors, exec: impl(tensors)


def make_operator(op, impl, params_cls, doc, outputs=("out",), returns_out=True):
    """A Python function for the bound operator ``impl(params, tensors, exec)``.

    ``outputs`` names the operator's results in order: a result the caller passed is returned
    as the caller's own object (the same torch tensor, not a new one over its memory); none
    (or returns_out False): the function returns None.
    """
    if not returns_out:
        outputs = ()
    names = frozenset(params_cls.fields) if params_cls is not None else frozenset()

    def operator(params=None, *, exec=None, threads=None, **kwargs):
        conv = Converter(op)
        fields = {k: kwargs.pop(k) for k in list(kwargs) if k in names}
        tensors = {k: conv(v, k) for k, v in kwargs.items()}
        x = _exec_config(op, exec, threads)
        if params_cls is None:
            if params is not None or fields:
                raise TypeError(f"attnref.{op}: takes no params")
            result = impl(tensors, x)
        else:
            result = impl(_params(op, params_cls, params, fields), tensors, x)
        if not outputs:
            return None
        result = conv.result(result)
        if isinstance(result, tuple):
            return tuple(r if kwargs.get(n) is None else kwargs[n] for n, r in zip(outputs, result))
        return result if kwargs.get(outputs[0]) is None else kwargs[outputs[0]]

    operator.__name__ = op
    operator.__qualname__ = op
    operator.__doc__ = doc
    return operator
