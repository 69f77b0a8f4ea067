"""Helpers for dict/tuple structs of arrays (the items of the episode columns).

A *struct* is a dict or tuple nesting whose other values are leaves (arrays, scalars,
anything else). Re-exported by :mod:`jaxsampler.episodes.lookback` (``tree_map``,
``batch``, ``data_len``), where other layers import them from.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["batch", "batch_size", "data_len", "leaves", "reorder", "tree_map"]


def tree_map(fn: Callable[..., Any], tree: Any, *rest: Any) -> Any:
    """Maps over dict/tuple structs (dict key order of ``tree`` kept); anything else is a leaf."""
    if isinstance(tree, dict):
        return {k: tree_map(fn, v, *(r[k] for r in rest)) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(tree_map(fn, v, *(r[i] for r in rest)) for i, v in enumerate(tree))
    return fn(tree, *rest)


def leaves(tree: Any) -> list[Any]:
    """The leaves of ``tree`` in :func:`tree_map` order."""
    out: list[Any] = []
    tree_map(out.append, tree)
    return out


def data_len(data: Any) -> int:
    """Number of items in a column: ``len`` of a list, else the leading dim of the first leaf."""
    if type(data) is np.ndarray:
        return data.shape[0]
    if isinstance(data, list):
        return len(data)
    found = leaves(data)
    return int(np.shape(found[0])[0]) if found else 0


def batch_size(data: Any) -> int:
    """Number of items in a batch: ``len`` of a list or array, else the leading dim of
    the first leaf of a struct."""
    if isinstance(data, (dict, tuple)):
        return data_len(data)
    return len(data)


def batch(items: list[Any]) -> Any:
    """Stacks a list of structs into one struct of arrays (leading axis = item).

    Leaves of different shapes are broadcast to the first one's shape, as RLlib's
    ``batch`` does (a scalar ``fill`` next to vector items); the dtype is the items'
    common one (Python scalars taken as weakly typed).
    """
    if len(items) == 0:
        raise ValueError("Input `list_of_structs` does not contain any items.")
    return tree_map(_stack, items[0], *items[1:])


def _stack(*xs: Any) -> np.ndarray:
    arrays = [np.asarray(x) for x in xs]
    shape = arrays[0].shape
    if all(a.shape == shape for a in arrays):
        return np.stack(arrays)
    # (Python scalars, e.g. a raw fill value, do not widen the items' dtype)
    weak = [x if isinstance(x, (bool, int, float)) else a for x, a in zip(xs, arrays)]
    out = np.empty((len(arrays), *shape), np.result_type(*weak))
    for i, a in enumerate(arrays):
        out[i] = a  # (ValueError where a cannot be broadcast to the first item's shape)
    return out


def reorder(item: Any, like: Any) -> Any:
    """``item`` with dict keys in ``like``'s order (structs are matched by key)."""
    if isinstance(like, dict) and isinstance(item, dict):
        return {k: reorder(item[k], v) for k, v in like.items()}
    if isinstance(like, tuple) and isinstance(item, (tuple, list)):
        return tuple(reorder(i, v) for i, v in zip(item, like))
    return item
