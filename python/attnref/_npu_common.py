"""What the torch_npu calls share: argument checks as torch_npu makes them, error renaming."""

import re

import numpy as np

from . import _attnref
from ._attnref import _torch_view

EXEC = _attnref.ExecConfig()
_INT32 = np.dtype(np.int32)


def call(name, impl, renames, *args):
    """Runs ``impl(*args)``; an error message names the torch_npu call and its arguments: each of
    our names in ``renames`` is replaced, as a whole name, by torch_npu's, and ``params.`` is
    dropped from the rest (a params field is a torch_npu argument of the same name)."""
    try:
        return impl(*args)
    except (ValueError, IndexError, TypeError) as e:
        msg = str(e)
        for ours, theirs in renames.items():
            msg = re.sub(r"(?<![\w.])" + re.escape(ours) + r"(?!\w)", theirs, msg)
        msg = re.sub(r"(?<![\w.])params\.(\w+)", r"\1", msg)
        raise type(e)(f"torch_npu.{name}: {msg}") from None


def tensor(conv, x, name):
    """A tensor argument torch_npu requires (TypeError for None or another kind of object)."""
    if type(x) is np.ndarray:
        return x
    a = _torch_view(x)  # Converter's common case inline: a decode call has six tensors
    if a is not None:
        conv.torch = True
        return a
    a = conv(x, name)
    if not isinstance(a, np.ndarray):
        raise TypeError(f"torch_npu.{conv.op}: {name} must be a tensor, got {type(x).__name__}")
    return a


def host_int32(conv, x, name):
    """A length tensor torch_npu reads on the host as int32 (1-D)."""
    a = tensor(conv, x, name)
    if a.dtype is not _INT32 and a.dtype != _INT32:
        raise TypeError(f"torch_npu.{conv.op}: {name} must be int32 (torch_npu reads it as int32 "
                        f"on the host), got {a.dtype}")
    return a


def index32(conv, x, name, required=True):
    """An index tensor (block table, slot mapping, sparse indices): int32, as torch_npu's kernels
    read it (attnref's layer 1 also takes int64). None passes when not ``required``."""
    a = tensor(conv, x, name) if required or x is not None else None
    if a is not None and a.dtype is not _INT32 and a.dtype != _INT32:
        raise TypeError(f"torch_npu.{conv.op}: {name} must be int32 (torch_npu's kernel reads "
                        f"int32 indices), got {a.dtype}")
    return a


def out_tensor(conv, x, name="out"):
    """The caller's output: required, contiguous (as torch_npu checks), written in place."""
    a = tensor(conv, x, name)
    if not a.flags.c_contiguous:
        raise ValueError(f"torch_npu.{conv.op}: {name} must be contiguous")
    return a


def heads_view(a, heads):
    """A [T, H*D] tensor seen as [T, H, D] (2-D queries, as SGLang passes them); else as given."""
    if a is not None and a.ndim == 2 and heads > 0 and a.shape[1] % heads == 0:
        return a.reshape(a.shape[0], heads, a.shape[1] // heads)
    return a


def merge_heads(a):
    """A paged cache [numBlocks, blockSize, kvHeads, D] seen as [numBlocks, blockSize, kvHeads*D]."""
    if a.ndim != 4:
        return a
    if a.strides[2] == a.shape[3] * a.strides[3]:
        return np.lib.stride_tricks.as_strided(
            a, (a.shape[0], a.shape[1], a.shape[2] * a.shape[3]), a.strides[:2] + a.strides[3:],
            writeable=False)
    return a.reshape(a.shape[0], a.shape[1], -1)


