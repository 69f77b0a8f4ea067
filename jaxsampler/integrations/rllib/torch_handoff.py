"""Zero-copy hand-off of sampled batches to torch learners on the same device.

RLlib's torch learner turns a numpy ``MultiAgentBatch`` into tensors with
``convert_to_torch_tensor``: ``torch.from_numpy`` (no copy), then ``.float()`` on floating
columns (a copy unless already float32) and ``.to(device)`` (no copy on CPU). A batch whose
floating columns are float32 and whose arrays have non-negative strides therefore reaches
the learner on CPU without a copy; :func:`learner_copies` names the columns that would be
copied, :func:`to_torch` converts a batch (numpy columns with ``torch.from_numpy``, JAX
arrays through DLPack, which shares the buffer when torch can address the JAX array's
device) so the learner's own conversion passes the tensors through.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from jaxsampler.integrations.rllib import require_rllib

require_rllib()

import torch  # noqa: E402

__all__ = ["learner_copies", "tensor_of", "to_torch"]


def _is_jax(x: Any) -> bool:
    return type(x).__module__.startswith("jax") and hasattr(x, "__dlpack__")


def tensor_of(x: Any) -> Any:
    """``x`` as a torch tensor sharing its memory where possible.

    numpy arrays with numeric dtypes go through ``torch.from_numpy`` (a view; arrays with a
    negative stride are copied first, torch cannot view them); JAX arrays through DLPack
    (a view on CPU, and on a GPU both libraries can address); tensors pass through;
    anything else (object or string arrays, lists of infos, ``None``) is returned as is.
    """
    if isinstance(x, torch.Tensor) or x is None:
        return x
    if _is_jax(x):
        return torch.from_dlpack(x)
    if isinstance(x, np.ndarray):
        if x.dtype == object or x.dtype.kind in "USV":
            return x
        if any(s < 0 for s in x.strides):
            x = np.ascontiguousarray(x)
        if not x.flags.writeable:
            with warnings.catch_warnings():  # torch warns that the tensor is writable
                warnings.simplefilter("ignore")
                return torch.from_numpy(x)
        return torch.from_numpy(x)
    return x


def _columns(batch: Any) -> Mapping[Any, Any]:
    """A ``MultiAgentBatch``'s policy batches, or ``{None: batch}`` for a plain batch."""
    policy_batches = getattr(batch, "policy_batches", None)
    if policy_batches is not None:
        return policy_batches
    if isinstance(batch, Mapping):
        return {None: batch}
    raise TypeError(
        f"expected a SampleBatch, MultiAgentBatch or a dict of columns, got {type(batch).__name__}"
    )


def to_torch(batch: Any) -> dict[Any, dict[str, Any]]:
    """The columns of ``batch`` as torch tensors that share its memory (:func:`tensor_of`).

    Args:
        batch: a jaxsampler or RLlib ``SampleBatch`` / ``MultiAgentBatch``, or a dict of
            columns (numpy or JAX arrays).

    Returns:
        ``{policy_id: {column: tensor or the value as is}}`` (``policy_id`` is ``None`` for
        a single batch); nested columns (dict observations) are converted leaf by leaf.

    Raises:
        TypeError: ``batch`` is none of these.
    """
    return {pid: _convert(dict(cols)) for pid, cols in _columns(batch).items()}


def _convert(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _convert(v) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(_convert(v) for v in x)
    return tensor_of(x)


def learner_copies(batch: Any) -> list[tuple[Any, str, str]]:
    """The columns RLlib's torch learner would copy when it converts ``batch`` on CPU.

    Returns:
        ``(policy_id, column, reason)`` for every array column that is floating but not
        float32 or float16 (cast to float32), has a negative stride (torch cannot view it)
        or is not a numpy / JAX array or tensor (e.g. a Python number list). Object and
        string arrays and lists of dicts (infos, ids) are skipped, as RLlib leaves them.
    """
    out: list[tuple[Any, str, str]] = []
    for pid, cols in _columns(batch).items():
        for name, col in dict(cols).items():
            for leaf in _leaves(col):
                reason = _copy_reason(leaf)
                if reason:
                    out.append((pid, name, reason))
    return out


def _leaves(x: Any) -> list[Any]:
    if isinstance(x, dict):
        return [leaf for v in x.values() for leaf in _leaves(v)]
    if isinstance(x, tuple):
        return [leaf for v in x for leaf in _leaves(v)]
    return [x]


def _copy_reason(x: Any) -> str:
    if isinstance(x, np.ndarray):
        if x.dtype == object or x.dtype.kind in "USV":
            return ""
        if x.dtype.kind == "f" and x.dtype not in (np.float32, np.float16):
            return f"{x.dtype} cast to float32"
        if any(s < 0 for s in x.strides):
            return "negative stride"
        return ""
    if isinstance(x, torch.Tensor) or _is_jax(x) or x is None or isinstance(x, list):
        return ""
    return f"{type(x).__name__} converted with np.asarray"
