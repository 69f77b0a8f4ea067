"""``InfiniteLookbackBuffer``: one per-timestep column of an episode, plus its lookback.

Same constructor, methods and index semantics as RLlib's buffer of that name in ray 2.60
(its documentation and recorded behaviour), written anew. ``data`` is a ``list`` ("list
mode") or, once finalized ("numpy'ized", :meth:`~InfiniteLookbackBuffer.finalize`), an
ndarray or a dict/tuple struct of ndarrays with time as the leading axis. The first
``lookback`` items form the lookback region; ``len(buf)`` excludes it. The index rules are
in :meth:`~InfiniteLookbackBuffer.get`.

Where RLlib 2.60 has a bug (inconsistent with RLlib's own docs or with its other
behaviour) that this class does not copy, a note "RLlib deviation (Bn)" sits at the code
concerned, numbered as ``tests/sa_differential.py`` excuses them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# (tree_map, batch and data_len are also imported from here by the other layers)
from jaxsampler.episodes._tree import batch, batch_size, data_len, leaves, reorder, tree_map

__all__ = ["InfiniteLookbackBuffer", "batch", "tree_map"]


# ----------------------------------------------------------------------------- spaces


class _SpaceLeaf:
    """What fill dummies and one-hot need of one leaf space."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, onehot: tuple[int, ...] | None):
        self.shape, self.dtype, self.onehot = shape, dtype, onehot


def _space_struct(space: Any) -> Any:
    """A struct (dict/tuple) of :class:`_SpaceLeaf` for a gymnasium or jaxsampler space."""
    from jaxsampler import spaces as js_spaces

    name = type(space).__name__
    subs = getattr(space, "spaces", None)
    if name == "Dict" and subs is not None:
        return {k: _space_struct(v) for k, v in sorted(dict(subs).items())}
    if name == "Tuple" and subs is not None:
        return tuple(_space_struct(v) for v in subs)
    if name == "Discrete":
        dtype = np.dtype(getattr(space, "dtype", np.int64) or np.int64)
        return _SpaceLeaf((), dtype, (int(space.n),))
    if name == "MultiDiscrete":
        return _SpaceLeaf(
            tuple(space.shape), np.dtype(space.dtype), tuple(int(n) for n in np.ravel(space.nvec))
        )
    if name == "Box" or isinstance(space, js_spaces.Box):
        return _SpaceLeaf(tuple(space.shape), np.dtype(space.dtype), None)
    raise TypeError(f"unsupported space for lookback buffers: {space!r}")


def _dummy(space_struct: Any, fill: Any, n: int | None, one_hot: bool) -> Any:
    """One dummy item (``n is None``) or a batch of ``n`` dummies, in the space's dtypes."""

    def leaf(s: _SpaceLeaf) -> np.ndarray:
        lead = () if n is None else (n,)
        if one_hot and s.onehot is not None:
            return np.full(lead + (int(sum(s.onehot)),), fill, np.float32)
        return np.full(lead + s.shape, fill, s.dtype)

    return tree_map(leaf, space_struct)


def _one_hot(x: Any, s: _SpaceLeaf) -> Any:
    """``x`` one-hot encoded for leaf space ``s`` (unchanged if ``s`` is not discrete).

    RLlib deviation (B3): an empty numpy'ized selection gives ``(0, n)`` arrays (RLlib's
    one-hot takes the max of an empty array and raises)."""
    if s.onehot is None:
        return x
    x = np.asarray(x)
    if len(s.onehot) == 1:
        return np.eye(s.onehot[0], dtype=np.float32)[x.astype(np.int64)]
    flat = x.reshape(x.shape[: x.ndim - len(s.shape)] + (-1,))
    parts = [
        np.eye(n, dtype=np.float32)[flat[..., i].astype(np.int64)] for i, n in enumerate(s.onehot)
    ]
    return np.concatenate(parts, axis=-1)


# ----------------------------------------------------------------------------- buffer


class InfiniteLookbackBuffer:
    """A column of per-timestep data with a lookback region (see the module docstring).

    Args:
        data: a list of items (list mode) or a numpy'ized array / struct of arrays.
        lookback: how many leading items are lookback (clipped to the data's length).
        space: optional gymnasium or jaxsampler space of one item; used for ``fill``
            dummies (their dtype) and ``one_hot_discrete``.
    """

    __slots__ = ("data", "finalized", "lookback", "_space", "_struct", "_borrowed")

    def __init__(self, data: Any = None, lookback: int = 0, space: Any = None):
        self.data = [] if data is None else data
        self.finalized = not isinstance(self.data, list)
        self.lookback = min(int(lookback), self.len_incl_lookback())
        self.space = space
        self._borrowed = False

    @classmethod
    def trusted(
        cls, data: Any, lookback: int, space: Any = None, *, borrowed: bool = True
    ) -> InfiniteLookbackBuffer:
        """A buffer over already-validated ``data`` without the constructor's checks or
        copies: the samplers' fast path. A list stays in list mode; anything else (an
        array or a struct of arrays, possibly a view) is taken as numpy'ized.
        ``lookback`` must not exceed the data's length.

        ``borrowed=True`` (the default: the samplers hand out views of one call's shared
        columns) makes the buffer copy numpy'ized data before its first in-place write
        (:meth:`set`), so writing to this buffer never changes the arrays it was built
        over (see :attr:`borrowed`)."""
        buf = cls.__new__(cls)
        buf.data, buf.finalized, buf.lookback = data, not isinstance(data, list), lookback
        buf._space, buf._struct, buf._borrowed = space, None, borrowed
        return buf

    @property
    def borrowed(self) -> bool:
        """Whether the numpy'ized ``data`` is borrowed (views of arrays that others read,
        e.g. a sampler call's shared columns): the next in-place write (:meth:`set`)
        then copies the data first and the buffer owns it from then on. ``append``,
        ``extend`` and ``pop`` build new arrays, so they end the borrowing too. Setting
        it to ``True`` marks ``data`` as borrowed (a list-mode buffer ignores the flag:
        its writes replace list items, never array contents)."""
        return self._borrowed

    @borrowed.setter
    def borrowed(self, value: bool) -> None:
        self._borrowed = bool(value)

    def _own(self) -> None:
        """Copies borrowed numpy'ized data (copy-on-write), so in-place writes stay here."""
        if self._borrowed and self.finalized:
            self.data = tree_map(np.array, self.data)
        self._borrowed = False

    @property
    def space(self) -> Any:
        """The space of one item (``None``: unknown); used for fill dummies and one-hot."""
        return self._space

    @space.setter
    def space(self, value: Any) -> None:
        self._space = value
        self._struct = None

    @property
    def space_struct(self) -> Any:
        """Shapes/dtypes/one-hot sizes of the space, computed on first use (fill, one-hot)."""
        if self._struct is None and self._space is not None:
            self._struct = _space_struct(self._space)
        return self._struct

    # -- lengths ---------------------------------------------------------------------

    def len_incl_lookback(self) -> int:
        """Like RLlib's: the number of items, lookback included."""
        return data_len(self.data)

    def __len__(self) -> int:
        return max(self.len_incl_lookback() - self.lookback, 0)

    # -- numpy'ize -------------------------------------------------------------------

    def finalize(self) -> None:
        """Stacks the list of items into arrays (idempotent). Raises on an empty list."""
        if not self.finalized:
            self.data = batch(self.data)
            self.finalized, self._borrowed = True, False  # (new arrays)

    to_numpy = finalize

    # -- reading ---------------------------------------------------------------------

    def get(
        self,
        indices: int | list[int] | slice | None = None,
        *,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
    ) -> Any:
        """Items at ``indices``: an int, a list of ints, a slice, or ``None`` (all items
        after the lookback).

        Ints >= 0 count from the first non-lookback item; negative ints count from the end
        of all data (lookback included) or, with ``neg_index_as_lookback=True``, backwards
        from the first non-lookback item. Slices follow the same rules at both ends.
        Out-of-range items raise ``IndexError`` unless ``fill`` is given. Numpy'ized
        slices are views of ``data`` (no copy) when no padding or one-hot encoding is
        asked for.

        Slices reaching outside the data with ``fill`` pad as RLlib 2.60 does (see
        :meth:`_clip_slice`): both ends on one side of the data give ``|start - stop|``
        fill items (a reversed range too, so ``slice(5, None)`` on 3 items gives 2); a
        start before the data pads the left only; else a stop past the end pads the right.
        ``fill`` with ``one_hot_discrete`` gives one-hot-sized dummies holding ``fill`` in
        every slot. ``one_hot_discrete`` without a space raises ``ValueError`` where data
        would be converted (not for pure fill items).

        Raises:
            IndexError: an index outside the data (and no ``fill``).
            ValueError: ``one_hot_discrete`` on data of a buffer without a space.
        """
        if indices is None:
            data = self.data
            if type(data) is np.ndarray and not one_hot_discrete:
                return data[self.lookback :]  # the common case: a view, no index rules
            part = self._get_slice(slice(None), neg_index_as_lookback, None, False)
            return self._convert_batch(part, True) if one_hot_discrete else part
        if isinstance(indices, slice):
            return self._get_slice(indices, neg_index_as_lookback, fill, one_hot_discrete)
        if isinstance(indices, (list, np.ndarray)):
            items = [
                self._get_int(int(i), neg_index_as_lookback, fill, one_hot_discrete)
                for i in indices
            ]
            if not self.finalized:
                return items
            # RLlib deviation (B7): the items' common dtype also with fill items (RLlib
            # takes the first item's: float32 if that is a fill item, else float64).
            # RLlib deviation (B2): get([]) gives an empty array (RLlib raises ValueError).
            return batch(items) if items else np.array([])
        return self._get_int(int(indices), neg_index_as_lookback, fill, one_hot_discrete)

    __getitem__ = get

    def _position(self, i: int, nial: bool) -> int:
        if i >= 0:
            return self.lookback + i
        return self.lookback + i if nial else self.len_incl_lookback() + i

    def _convert(self, x: Any, one_hot: bool) -> Any:
        if not one_hot:
            return x
        if self.space_struct is None:
            raise ValueError(
                "one_hot_discrete=True needs a buffer with a space (pass space=... to "
                f"{type(self).__name__}, or observation_space/action_space to the episode)"
            )
        return (
            tree_map(_one_hot, x, self.space_struct)
            if isinstance(x, (dict, tuple))
            else _one_hot(x, self.space_struct)
        )

    def _get_int(self, i: int, nial: bool, fill: Any, one_hot: bool) -> Any:
        return self._item_at(self._position(i, nial), fill, one_hot)

    def _item_at(self, pos: int, fill: Any, one_hot: bool) -> Any:
        """The item at absolute position ``pos``, or the fill item when out of range."""
        n = self.len_incl_lookback()
        # RLlib deviation (B1): numpy'ized too, a position outside the data (an index with
        # neg_index_as_lookback reaching past the lookback) raises instead of wrapping
        if not 0 <= pos < n:
            if fill is None:
                if self.finalized:
                    raise IndexError(f"index {pos} is out of bounds for axis 0 with size {n}")
                raise IndexError("list index out of range")
            return self._fill_item(fill, one_hot)
        item = tree_map(lambda x: x[pos], self.data) if self.finalized else self.data[pos]
        return self._convert(item, one_hot)

    def _fill_item(self, fill: Any, one_hot: bool) -> Any:
        """One padding item: ``fill`` itself, or a dummy in the space's dtypes."""
        return fill if self.space_struct is None else _dummy(self.space_struct, fill, None, one_hot)

    def _slice_bounds(self, s: slice, nial: bool) -> tuple[int, int, int]:
        """Absolute ``(start, stop, step)``; both ends follow the int index rules."""
        start = self.lookback if s.start is None else self._position(s.start, nial)
        stop = self.len_incl_lookback() if s.stop is None else self._position(s.stop, nial)
        return start, stop, 1 if s.step is None else s.step

    def _clip_slice(self, s: slice, nial: bool) -> tuple[slice, int, int, int]:
        """RLlib's reading of a slice: the slice of ``data`` clipped to it, the length of
        the range before clipping at the right end (0: no data part), and how many fill
        items go to its left and right.

        Ends outside ``[0, N)`` are clipped; the fill counts follow RLlib 2.60: both ends
        on the same side of the data give ``|start - stop|`` fill items there (also for a
        reversed range); a start before the data fills the left side only (the right end
        is then just clipped); else a stop past the end fills the right side; a stop
        before the data with the start inside (a reversed range, or a negative step)
        fills ``-stop - 1`` on the right and, for a start past the end, ``start - N + 1``
        on the left.

        RLlib deviation (B4): a slice ending before an *empty* buffer gives no data and its
        fill items, as on a non-empty buffer (RLlib trips an internal assertion).
        """
        n = self.len_incl_lookback()
        start, stop, step = self._slice_bounds(s, nial)
        left = right = 0
        stop_at: int | None = stop
        if start < 0 and stop < 0:
            left, start, stop_at = abs(start - stop), 0, 0
        elif start >= n and stop >= n:
            right, start, stop_at = abs(start - stop), n, n
        elif start < 0:
            left, start = -start, 0
        elif stop >= n:
            right, stop_at = stop - n, n
        elif stop < 0:
            if start >= n:
                left, start = start - n + 1, n - 1
            right, stop_at = -stop - 1, None
        if stop_at is None and step > 0:  # (nothing: RLlib's stop is -LARGE_INTEGER)
            stop_at = 0
        sl = slice(start, stop_at, step)  # (None with a negative step: to the beginning)
        # RLlib converts (one-hot) and pads the slice of the data whenever the range
        # it computed is not empty, even where clipping left no data in it
        if stop_at is None:
            span = start + 1
        else:
            span = max(0, (stop_at - start + (step - (1 if step > 0 else -1))) // step)
        return sl, span, left, right

    def _get_slice(self, s: slice, nial: bool, fill: Any, one_hot: bool) -> Any:
        sl, size, left, right = self._clip_slice(s, nial)
        part = tree_map(lambda x: x[sl], self.data) if self.finalized else self.data[sl]
        if size > 0:
            part = self._convert_batch(part, one_hot)
        if fill is None or not (left or right):
            return part
        return self._pad(part if size > 0 else None, left, right, fill, one_hot)

    def _convert_batch(self, part: Any, one_hot: bool) -> Any:
        if not one_hot:
            return part
        if self.space_struct is None:
            return self._convert(part, True)  # (raises: no space)
        if self.finalized:
            return tree_map(_one_hot, part, self.space_struct)
        return [self._convert(x, True) for x in part]

    def _pad(self, part: Any, left: int, right: int, fill: Any, one_hot: bool) -> Any:
        """``part`` (``None``: nothing) with ``left`` / ``right`` fill items around it."""
        if not self.finalized:
            one = self._fill_item(fill, one_hot)
            return [one] * left + (list(part) if part is not None else []) + [one] * right

        def fills(k: int) -> Any:
            if self.space_struct is None:
                return np.array([fill] * k)
            return _dummy(self.space_struct, fill, k, one_hot)

        out = part
        for k, before in ((left, True), (right, False)):
            if not k:
                continue
            pad = fills(k)
            if out is None:
                out = pad
            else:
                join = (
                    (lambda p, x: np.concatenate([p, x]))
                    if before
                    else (lambda p, x: np.concatenate([x, p]))
                )
                out = tree_map(join, pad, reorder(out, pad))
        return out

    # -- writing ---------------------------------------------------------------------

    def append(self, item: Any) -> None:
        """Like RLlib's: adds ``item`` at the end."""
        if self.finalized:
            self.data = tree_map(
                lambda d, x: np.concatenate([d, np.asarray(x)[None]]),
                self.data,
                reorder(item, self.data),
            )
            self._borrowed = False  # (new arrays)
        else:
            self.data.append(item)

    def extend(self, items: Any) -> None:
        """Like RLlib's: adds ``items`` (a list, or a batch when numpy'ized) at the end."""
        if self.finalized:
            if isinstance(items, list):
                if not items:
                    return
                items = batch(items) if isinstance(items[0], (dict, tuple)) else np.array(items)
            self.data = tree_map(
                lambda d, x: np.concatenate([d, np.asarray(x)]),
                self.data,
                reorder(items, self.data),
            )
            self._borrowed = False  # (new arrays)
        else:
            self.data.extend(items)

    def pop(self, index: int = -1) -> None:
        """Like RLlib's: removes the item at ``index`` of all data (lookback included)."""
        if self.finalized:
            pos = index % self.len_incl_lookback()
            self.data = tree_map(lambda d: np.delete(d, pos, axis=0), self.data)
            self._borrowed = False  # (new arrays)
        else:
            self.data.pop(index)

    def concat(self, other: InfiniteLookbackBuffer) -> None:
        """Appends ``other``'s non-lookback items."""
        self.extend(other.get())

    def set(
        self, new_data: Any, *, at_indices: Any = None, neg_index_as_lookback: bool = False
    ) -> None:
        """Overwrites items (same index rules as :meth:`get`, without ``fill``).

        ``at_indices=None`` means all non-lookback items; a slice is clipped to the data
        like in :meth:`get` and ``new_data`` must have the clipped slice's length; a list
        of indices takes one item of ``new_data`` per index (a list of items, an array,
        or a struct of arrays); an int takes one item. Nothing is written when any of
        these checks fails (RLlib may write part of the data before it raises).

        Raises:
            IndexError: out-of-range int index, or ``new_data`` of the wrong length.
            ValueError: a list given to a numpy'ized buffer for a slice; a new item
                outside the buffer's space (numpy'ized buffers only).
        """
        n = self.len_incl_lookback()
        if at_indices is None:
            at_indices = slice(0, None)
        if isinstance(at_indices, slice):
            if self.finalized and isinstance(new_data, list):
                raise ValueError(
                    "a numpy'ized buffer needs new_data as an ndarray or a struct of "
                    "ndarrays for a slice, not a list"
                )
            sl, _, _, _ = self._clip_slice(at_indices, neg_index_as_lookback)
            # RLlib deviation (B9): the data's length, as get() counts it, also with a
            # lookback longer than the data after pop() (RLlib counts lookback + len, so
            # equal-size writes fail)
            positions = list(range(n))[sl]
            size = len(positions)
            given = batch_size(new_data) if self.finalized else len(new_data)
            if given != size:
                raise IndexError(
                    f"Cannot `set()` value via at_indices={sl} (option "
                    f"neg_index_as_lookback={neg_index_as_lookback})! Slice of data does NOT "
                    f"have the same size as `new_data` ({size} vs {given})."
                )
            values = (
                [tree_map(lambda x, j=j: x[j], new_data) for j in range(size)]
                if self.finalized
                else list(new_data)
            )
        elif isinstance(at_indices, (list, np.ndarray)):
            positions = [self._set_position(int(i), neg_index_as_lookback) for i in at_indices]
            if isinstance(new_data, (list, tuple)) or not self.finalized:
                values = list(new_data)[: len(positions)]
            else:  # an array or a struct of arrays, as for slices (RLlib deviation (B8):
                # RLlib indexes a struct by position, KeyError)
                values = [
                    tree_map(lambda x, j=j: x[j], new_data)
                    for j in range(min(len(positions), batch_size(new_data)))
                ]
            if len(values) < len(positions):
                raise IndexError(
                    f"Cannot `set()` {len(positions)} items (at_indices={at_indices}) from "
                    f"new_data holding {len(values)}"
                )
        else:
            positions = [self._set_position(int(at_indices), neg_index_as_lookback)]
            values = [new_data]
        # Each new item against the whole space: RLlib deviation (B5), RLlib checks each
        # leaf of a Dict/Tuple item against the whole space, so it always fails; and none
        # for an empty range, RLlib deviation (B6), RLlib reads new_data[0] and raises.
        if self.finalized and self._space is not None and hasattr(self._space, "contains"):
            for v in values:
                if not bool(np.asarray(self._space.contains(v))):
                    raise ValueError(
                        f"new value {v!r} is not in the buffer's space {self._space!r}"
                    )
        if positions:
            self._own()
        for p, v in zip(positions, values):
            if self.finalized:

                def put(d: np.ndarray, x: Any, p: int = p) -> None:
                    d[p] = x

                tree_map(put, self.data, reorder(v, self.data))
            else:
                self.data[p] = v

    def _set_position(self, i: int, nial: bool) -> int:
        """The absolute position an int index of :meth:`set` writes to (``IndexError``
        when it is outside the data)."""
        n = self.len_incl_lookback()
        p = self._position(i, nial)
        if not 0 <= p < n:
            raise IndexError(
                f"Cannot `set()` value at index {i} (option neg_index_as_lookback={nial}): "
                f"the buffer holds {n} items (lookback included)"
            )
        return p

    __setitem__ = lambda self, k, v: self.set(v, at_indices=k)

    def __add__(self, other: Any) -> InfiniteLookbackBuffer:
        if self.finalized:
            raise RuntimeError(f"cannot `add` to a numpy'ized {type(self).__name__}")
        if isinstance(other, InfiniteLookbackBuffer):
            data = self.data + list(other.data[other.lookback :])
        elif isinstance(other, list):
            data = self.data + other
        else:
            data = [d + other for d in self.data]
        return InfiniteLookbackBuffer(data, self.lookback, self._space)

    # -- state -----------------------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        """Like RLlib's: the buffer's state, for :meth:`from_state`; it keeps the space
        object itself (picklable) where RLlib keeps a dict serialization."""
        return {
            "data": self.data,
            "lookback": self.lookback,
            "finalized": self.finalized,
            "space": self._space,
        }

    @staticmethod
    def from_state(state: dict[str, Any]) -> InfiniteLookbackBuffer:
        """Like RLlib's: the buffer :meth:`get_state` returned ``state`` of."""
        buf = InfiniteLookbackBuffer(space=state["space"])
        buf.data, buf.finalized, buf.lookback = state["data"], state["finalized"], state["lookback"]
        # (the state's data is taken as is, as RLlib does: not borrowed)
        return buf

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, InfiniteLookbackBuffer):
            return False
        if (self.lookback, self.finalized, self._space) != (
            other.lookback,
            other.finalized,
            other._space,
        ):
            return False
        try:
            la, lb = (
                leaves(self.data) if self.finalized else self.data,
                leaves(other.data) if other.finalized else other.data,
            )
            return len(la) == len(lb) and all(
                np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb)
            )
        except (TypeError, ValueError):
            return self.data == other.data

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        lb = self.lookback
        if self.finalized:
            head, tail = (
                tree_map(lambda x: x[:lb], self.data),
                tree_map(lambda x: x[lb:], self.data),
            )
        else:
            head, tail = self.data[:lb], self.data[lb:]
        return f"{type(self).__name__}({head} <- lookback({lb}) | {tail})"
