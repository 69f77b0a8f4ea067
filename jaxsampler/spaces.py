"""Spaces: shapes, dtypes, bounds, `sample(key)` and `contains(x)`, all jittable.

Spaces are immutable and hashable (they are static configuration: two equal spaces
hash equal, so they can sit in static fields of jitted code without recompiling).
Bounds are kept as read-only numpy arrays; ``sample`` and ``contains`` turn them into
constants while tracing.

Conversions: :func:`from_gymnax_space`, :func:`from_gymnasium_space` and :meth:`Space.to_gymnasium`.

Host-side validation: :func:`check_value` (one value against a space, returned as numpy
data of the space) and :class:`ValueChecker` (the same check precomputed for one space,
with a fast path for the per-step common case). Every host-side caller (host envs, the
host sampler, the policy client) validates with these two.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "Space",
    "compatible",
    "share_one_space",
    "Box",
    "Discrete",
    "MultiDiscrete",
    "Dict",
    "Tuple",
    "from_gymnax_space",
    "from_gymnasium_space",
    "convert_space",
    "check_value",
    "ValueChecker",
]


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.array(a, copy=True)
    a.setflags(write=False)
    return a


class Space:
    """Base class. Subclasses define ``shape``, ``dtype``, ``sample`` and ``contains``."""

    shape: tuple[int, ...]
    dtype: np.dtype

    def sample(self, key: jax.Array) -> Any:
        """Draws one uniform random element. Safe under jit and vmap."""
        raise NotImplementedError

    def contains(self, x: Any) -> jax.Array:
        """Returns a scalar bool array: whether ``x`` (shape must match) lies in the space.

        A shape mismatch is a static fact and returns ``False`` without tracing.
        Safe under jit and vmap.
        """
        raise NotImplementedError

    def sample_batch(self, key: jax.Array, batch_shape: tuple[int, ...]) -> Any:
        """Draws ``prod(batch_shape)`` independent elements, stacked on leading ``batch_shape``.

        Safe under jit and vmap. Array spaces draw in one call (no key split per element).
        """
        n = int(np.prod(batch_shape))
        keys = jax.random.split(key, n)
        flat = jax.vmap(self.sample)(keys)
        return jax.tree.map(lambda x: x.reshape(tuple(batch_shape) + x.shape[1:]), flat)

    def zeros(self) -> Any:
        """An all-zeros element with the space's shape and dtype (a placeholder value)."""
        return jnp.zeros(self.shape, self.dtype)

    def to_gymnasium(self) -> Any:
        """The equivalent ``gymnasium.spaces`` object (needs gymnasium installed)."""
        raise NotImplementedError

    def _key(self) -> tuple:
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Space) and type(self) is type(other) and self._key() == other._key()
        )

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._key()))


class Box(Space):
    """A (possibly unbounded) box in R^n, or an integer box.

    Args:
        low: lower bound, a scalar or an array broadcastable to ``shape``.
        high: upper bound, likewise.
        shape: the element shape; inferred from ``low``/``high`` when omitted.
        dtype: element dtype (default float32).
    """

    def __init__(
        self,
        low: float | np.ndarray | Sequence[float],
        high: float | np.ndarray | Sequence[float],
        shape: Sequence[int] | None = None,
        dtype: Any = np.float32,
    ):
        self.dtype = np.dtype(dtype)
        low_a = np.asarray(low, dtype=np.float64)
        high_a = np.asarray(high, dtype=np.float64)
        if shape is None:
            shape = np.broadcast_shapes(low_a.shape, high_a.shape)
        self.shape = tuple(int(s) for s in shape)
        try:
            low_a = np.broadcast_to(low_a, self.shape)
            high_a = np.broadcast_to(high_a, self.shape)
        except ValueError as e:
            raise ValueError(
                f"Box: low {low_a.shape} / high {high_a.shape} do not broadcast to shape "
                f"{self.shape}"
            ) from e
        if np.any(low_a > high_a):
            raise ValueError("Box: low must be <= high everywhere")
        if np.issubdtype(self.dtype, np.integer):
            # Infinite (or out-of-range) bounds clamp to the dtype's range, as in Gymnasium.
            info = np.iinfo(self.dtype)
            low_a, high_a = np.clip(low_a, info.min, info.max), np.clip(high_a, info.min, info.max)
        # "+ 0.0" turns -0.0 into 0.0 so equal boxes hash and compare equal.
        self.low = _frozen(low_a.astype(self.dtype) + self.dtype.type(0))
        self.high = _frozen(high_a.astype(self.dtype) + self.dtype.type(0))

    def _key(self) -> tuple:
        return (self.shape, self.dtype.str, self.low.tobytes(), self.high.tobytes())

    def __repr__(self) -> str:
        lo, hi = self.low, self.high
        if lo.size and np.all(lo == lo.flat[0]) and np.all(hi == hi.flat[0]):
            lo, hi = lo.flat[0], hi.flat[0]
        return f"Box({lo}, {hi}, {self.shape}, {self.dtype.name})"

    @property
    def is_bounded(self) -> bool:
        """Whether every element has a finite ``low`` and a finite ``high``."""
        return bool(np.all(np.isfinite(self.low)) and np.all(np.isfinite(self.high)))

    def sample(self, key: jax.Array) -> jax.Array:
        return self.sample_batch(key, ())

    def sample_batch(self, key: jax.Array, batch_shape: tuple[int, ...]) -> jax.Array:
        shape = tuple(batch_shape) + self.shape
        if self.dtype == np.bool_:  # False/True within the bounds, each with probability 1/2
            bit = jax.random.bernoulli(key, 0.5, shape)
            lo, hi = jnp.asarray(self.low > 0), jnp.asarray(self.high > 0)
            return jnp.where(lo == hi, lo, bit)
        if np.issubdtype(self.dtype, np.integer):
            return self._sample_int(key, shape)
        low = np.where(np.isfinite(self.low), self.low, -1.0).astype(self.dtype)
        high = np.where(np.isfinite(self.high), self.high, 1.0).astype(self.dtype)
        # low * (1 - u) + high * u never overflows, even for bounds near the dtype's max.
        w = jax.random.uniform(key, shape, self.dtype)
        u = jnp.clip(
            jnp.asarray(low) * (1 - w) + jnp.asarray(high) * w, jnp.asarray(low), jnp.asarray(high)
        )
        if self.is_bounded:
            return u
        # Unbounded sides: a half-normal offset from the finite bound, or a normal if both open.
        n = jax.random.normal(jax.random.fold_in(key, 1), shape, self.dtype)
        both_inf = ~np.isfinite(self.low) & ~np.isfinite(self.high)
        lo_inf = ~np.isfinite(self.low) & np.isfinite(self.high)
        hi_inf = np.isfinite(self.low) & ~np.isfinite(self.high)
        out = jnp.where(both_inf, n, u)
        out = jnp.where(lo_inf, jnp.asarray(self.high) - jnp.abs(n), out)
        out = jnp.where(hi_inf, jnp.asarray(self.low) + jnp.abs(n), out)
        return out.astype(self.dtype)

    def _sample_int(self, key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
        """Uniform integers in [low, high] for any <= 32-bit dtype, full range included:
        32 random bits, reduced modulo the span in uint32 arithmetic (wrap-around exact)."""
        if self.dtype.itemsize > 4:
            raise TypeError(f"Box: sampling {self.dtype} needs JAX x64 mode; use an int32 Box")
        span = (self.high.astype(np.int64) - self.low.astype(np.int64) + 1) % (1 << 32)
        bits = jax.random.bits(key, shape, jnp.uint32)
        span_u = jnp.asarray(span.astype(np.uint32))
        offset = jnp.where(span_u == 0, bits, bits % jnp.maximum(span_u, 1))
        value = jnp.asarray((self.low.astype(np.int64) % (1 << 32)).astype(np.uint32)) + offset
        if np.issubdtype(self.dtype, np.signedinteger):
            return jax.lax.bitcast_convert_type(value, jnp.int32).astype(self.dtype)
        return value.astype(self.dtype)

    def contains(self, x: Any) -> jax.Array:
        x = jnp.asarray(x)
        if x.shape != self.shape:
            return jnp.asarray(False)
        if np.issubdtype(self.dtype, np.integer) and not jnp.issubdtype(x.dtype, jnp.integer):
            return jnp.asarray(False)
        inside = (x >= jnp.asarray(self.low)) & (x <= jnp.asarray(self.high))
        return jnp.all(inside)

    def to_gymnasium(self) -> Any:
        import gymnasium

        dtype: Any = self.dtype  # gymnasium's stubs want a scalar type; a dtype works too
        return gymnasium.spaces.Box(self.low, self.high, self.shape, dtype)


class Discrete(Space):
    """Integers ``start, ..., start + n - 1`` (scalar shape, int32)."""

    def __init__(self, n: int, start: int = 0, dtype: Any = np.int32):
        if int(n) < 1:
            raise ValueError(f"Discrete: n must be >= 1, got {n}")
        self.n = int(n)
        self.start = int(start)
        self.shape = ()
        self.dtype = np.dtype(dtype)

    def _key(self) -> tuple:
        return (self.n, self.start, self.dtype.str)

    def __repr__(self) -> str:
        return (
            f"Discrete({self.n})" if self.start == 0 else f"Discrete({self.n}, start={self.start})"
        )

    def sample(self, key: jax.Array) -> jax.Array:
        return self.sample_batch(key, ())

    def sample_batch(self, key: jax.Array, batch_shape: tuple[int, ...]) -> jax.Array:
        return jax.random.randint(
            key, tuple(batch_shape), self.start, self.start + self.n, dtype=self.dtype
        )

    def contains(self, x: Any) -> jax.Array:
        x = jnp.asarray(x)
        if x.shape != () or not jnp.issubdtype(x.dtype, jnp.integer):
            return jnp.asarray(False)
        return (x >= self.start) & (x < self.start + self.n)

    def to_gymnasium(self) -> Any:
        import gymnasium

        return gymnasium.spaces.Discrete(self.n, start=self.start)


class MultiDiscrete(Space):
    """A vector of independent discrete choices; entry ``i`` lies in ``[0, nvec[i])``."""

    def __init__(self, nvec: Sequence[int] | np.ndarray, dtype: Any = np.int32):
        nvec_a = np.asarray(nvec, dtype=np.int64)
        if nvec_a.size == 0 or np.any(nvec_a < 1):
            raise ValueError(f"MultiDiscrete: every entry of nvec must be >= 1, got {nvec_a}")
        self.dtype = np.dtype(dtype)
        self.nvec = _frozen(nvec_a.astype(self.dtype))
        self.shape = tuple(self.nvec.shape)

    def _key(self) -> tuple:
        return (self.shape, self.dtype.str, self.nvec.tobytes())

    def __repr__(self) -> str:
        return f"MultiDiscrete({self.nvec.tolist()})"

    def sample(self, key: jax.Array) -> jax.Array:
        return self.sample_batch(key, ())

    def sample_batch(self, key: jax.Array, batch_shape: tuple[int, ...]) -> jax.Array:
        u = jax.random.uniform(key, tuple(batch_shape) + self.shape)
        return jnp.minimum(jnp.floor(u * self.nvec), self.nvec - 1).astype(self.dtype)

    def contains(self, x: Any) -> jax.Array:
        x = jnp.asarray(x)
        if x.shape != self.shape or not jnp.issubdtype(x.dtype, jnp.integer):
            return jnp.asarray(False)
        return jnp.all((x >= 0) & (x < jnp.asarray(self.nvec)))

    def to_gymnasium(self) -> Any:
        import gymnasium

        return gymnasium.spaces.MultiDiscrete(self.nvec)


class Dict(Space):
    """A mapping of names to sub-spaces; elements are ``dict`` pytrees (keys sorted)."""

    def __init__(self, spaces: Mapping[str, Space] | None = None, **kwargs: Space):
        items = dict(spaces or {}, **kwargs)
        for k, v in items.items():
            if not isinstance(v, Space):
                raise TypeError(f"Dict: entry {k!r} is {type(v).__name__}, not a jaxsampler Space")
        self.spaces = {k: items[k] for k in sorted(items)}
        self.shape = ()
        self.dtype = np.dtype(object)

    def _key(self) -> tuple:
        return tuple((k, v) for k, v in self.spaces.items())

    def __repr__(self) -> str:
        return "Dict(" + ", ".join(f"{k}: {v!r}" for k, v in self.spaces.items()) + ")"

    def __getitem__(self, key: str) -> Space:
        return self.spaces[key]

    def sample(self, key: jax.Array) -> dict:
        keys = jax.random.split(key, max(len(self.spaces), 1))
        return {k: s.sample(kk) for (k, s), kk in zip(self.spaces.items(), keys)}

    def contains(self, x: Any) -> jax.Array:
        if not isinstance(x, Mapping) or set(x) != set(self.spaces):
            return jnp.asarray(False)
        return jnp.all(jnp.stack([s.contains(x[k]) for k, s in self.spaces.items()]))

    def zeros(self) -> dict:
        return {k: s.zeros() for k, s in self.spaces.items()}

    def to_gymnasium(self) -> Any:
        import gymnasium

        return gymnasium.spaces.Dict({k: s.to_gymnasium() for k, s in self.spaces.items()})


class Tuple(Space):
    """A fixed-length sequence of sub-spaces; elements are ``tuple`` pytrees."""

    def __init__(self, spaces: Sequence[Space]):
        for i, v in enumerate(spaces):
            if not isinstance(v, Space):
                raise TypeError(f"Tuple: entry {i} is {type(v).__name__}, not a jaxsampler Space")
        self.spaces = tuple(spaces)
        self.shape = ()
        self.dtype = np.dtype(object)

    def _key(self) -> tuple:
        return self.spaces

    def __repr__(self) -> str:
        return "Tuple(" + ", ".join(repr(s) for s in self.spaces) + ")"

    def __getitem__(self, i: int) -> Space:
        return self.spaces[i]

    def __len__(self) -> int:
        return len(self.spaces)

    def sample(self, key: jax.Array) -> tuple:
        keys = jax.random.split(key, max(len(self.spaces), 1))
        return tuple(s.sample(k) for s, k in zip(self.spaces, keys))

    def contains(self, x: Any) -> jax.Array:
        if not isinstance(x, (tuple, list)) or len(x) != len(self.spaces):
            return jnp.asarray(False)
        return jnp.all(jnp.stack([s.contains(xi) for s, xi in zip(self.spaces, x)]))

    def zeros(self) -> tuple:
        return tuple(s.zeros() for s in self.spaces)

    def to_gymnasium(self) -> Any:
        import gymnasium

        return gymnasium.spaces.Tuple([s.to_gymnasium() for s in self.spaces])


def from_gymnasium_space(space: Any) -> Space:
    """Converts a ``gymnasium.spaces`` object (Box, Discrete, MultiDiscrete, Dict, Tuple)."""
    import gymnasium.spaces as gs

    if isinstance(space, gs.Box):
        return Box(space.low, space.high, space.shape, space.dtype)
    if isinstance(space, gs.Discrete):
        return Discrete(int(space.n), start=int(space.start))
    if isinstance(space, gs.MultiDiscrete):
        if np.any(np.asarray(space.start) != 0):
            raise ValueError(
                "from_gymnasium_space: MultiDiscrete with a nonzero start is not supported"
            )
        return MultiDiscrete(space.nvec)
    if isinstance(space, gs.Dict):
        return Dict({k: from_gymnasium_space(v) for k, v in space.spaces.items()})
    if isinstance(space, gs.Tuple):
        return Tuple([from_gymnasium_space(v) for v in space.spaces])
    raise TypeError(f"from_gymnasium_space: unsupported space type {type(space).__name__}")


def from_gymnax_space(space: Any) -> Space:
    """Converts a ``gymnax.environments.spaces`` object (Box, Discrete, Dict, Tuple).

    Raises:
        TypeError: an unsupported space type, or bounds / ``n`` that are JAX tracers (a
            space built inside ``jax.jit`` from traced params: build it once, outside, from
            concrete params).
    """
    from gymnax.environments import spaces as gx

    traced = [
        x
        for x in (
            getattr(space, "low", None),
            getattr(space, "high", None),
            getattr(space, "n", None),
        )
        if isinstance(x, jax.core.Tracer)
    ]
    if traced:
        raise TypeError(
            f"from_gymnax_space: {type(space).__name__} has traced bounds; build spaces outside "
            "jax.jit from concrete params (the gymnax adapter does so at construction)"
        )

    if isinstance(space, gx.Discrete):
        return Discrete(int(space.n))
    if isinstance(space, gx.Box):
        dtype = np.dtype(space.dtype)
        return Box(np.asarray(space.low), np.asarray(space.high), tuple(space.shape), dtype)
    if isinstance(space, gx.Dict):
        return Dict({k: from_gymnax_space(v) for k, v in space.spaces.items()})
    if isinstance(space, gx.Tuple):
        return Tuple([from_gymnax_space(v) for v in space.spaces])
    raise TypeError(f"from_gymnax_space: unsupported space type {type(space).__name__}")


def compatible(a: Space, b: Space) -> bool:
    """Whether data of space ``a`` can stand for ``b``: equal spaces, or ``Box`` es of the same
    shape and dtype (bounds may differ, e.g. a policy built for a clipped Box)."""
    if a == b:
        return True
    if isinstance(a, Box) and isinstance(b, Box):
        return a.shape == b.shape and a.dtype == b.dtype
    return False


def share_one_space(spaces: Iterable[Space]) -> bool:
    """Whether one policy can serve agents of ``spaces``: each is :func:`compatible` with
    the first (equal, or ``Box`` es of one shape and dtype whose bounds may differ). True
    for no spaces."""
    items = list(spaces)
    return all(compatible(s, items[0]) for s in items[1:])


def convert_space(space: Any) -> Space:
    """Returns ``space`` as a jaxsampler space, converting from gymnax or Gymnasium."""
    if isinstance(space, Space):
        return space
    mod = type(space).__module__
    if mod.startswith("gymnax"):
        return from_gymnax_space(space)
    if mod.startswith("gymnasium"):
        return from_gymnasium_space(space)
    raise TypeError(
        f"cannot convert {type(space).__name__} from module {mod} into a jaxsampler space"
    )


# -- host-side validation ----------------------------------------------------------------


def _short(x: Any) -> str:
    s = repr(x)
    return s if len(s) <= 80 else s[:77] + "..."


def check_value(
    x: Any,
    space: Space,
    what: str,
    *,
    values: bool = True,
    error: type[Exception] = ValueError,
) -> Any:
    """``x`` as numpy data of ``space``, checked on the host (numpy only; not jittable).

    Checks the structure (``Dict`` keys, ``Tuple`` length), each leaf's shape and dtype
    (cast to the space's dtype within the same kind: ints to ints, floats to floats,
    bools to anything numeric) and, with ``values``, what the space cannot hold: a
    ``Discrete`` / ``MultiDiscrete`` value out of range, NaN in a float ``Box``, an
    infinity where the ``Box`` is bounded. ``Box`` bounds themselves are not enforced
    (observations may leave them, as in Gymnasium).

    Args:
        x: the value (nested dicts / tuples of array-likes for ``Dict`` / ``Tuple``).
        space: a jaxsampler space.
        what: names the value in error messages (``"observation['agent0']"``).
        values: also check the values (above); ``False``: structure, shapes, dtypes only.
        error: the exception class raised (callers raise their own ``ValueError``
            subclasses).

    Returns:
        numpy data of the space; a leaf is a new array whenever ``values`` is set (the
        caller's buffer is never kept), else it may be ``x`` itself.

    Raises:
        error: with ``what`` and the problem in the message.
    """
    if isinstance(space, Dict):
        if not isinstance(x, Mapping) or set(x) != set(space.spaces):
            raise error(
                f"{what}: expected a dict with keys {sorted(space.spaces)}, got {_short(x)}"
            )
        return {
            k: check_value(x[k], s, f"{what}[{k!r}]", values=values, error=error)
            for k, s in space.spaces.items()
        }
    if isinstance(space, Tuple):
        if not isinstance(x, (tuple, list)) or len(x) != len(space.spaces):
            raise error(
                f"{what}: expected a sequence of {len(space.spaces)} items, got {_short(x)}"
            )
        return tuple(
            check_value(xi, s, f"{what}[{i}]", values=values, error=error)
            for i, (xi, s) in enumerate(zip(x, space.spaces))
        )
    try:
        a = np.asarray(x)
    except Exception as e:  # ragged lists and the like
        raise error(f"{what}: not array-like ({e})") from None
    shape, dtype = tuple(space.shape), space.dtype
    if a.shape != shape:
        raise error(f"{what} shape {a.shape} does not match {space!r} (expected shape {shape})")
    if a.dtype != dtype:
        if a.dtype.kind not in "biuf" or not np.can_cast(a.dtype, dtype, casting="same_kind"):
            raise error(f"{what}: dtype {a.dtype} cannot be cast to {dtype}")
        if dtype.kind in "iu" and a.dtype.kind in "iu" and a.size:
            # astype wraps integers silently (2**32 + 1 -> 1 in int32): refuse instead
            info = np.iinfo(dtype)
            lo, hi = int(a.min()), int(a.max())
            if lo < info.min or hi > info.max:
                bad = lo if lo < info.min else hi
                raise error(f"{what}: {bad} does not fit {dtype} (range {info.min}..{info.max})")
        a = a.astype(dtype)
    if values:
        _check_values(a, space, what, error)
        if a is x:
            a = a.copy()  # never keep a reference to the caller's buffer
    return a


def _check_values(a: np.ndarray, space: Space, what: str, error: type[Exception]) -> None:
    if isinstance(space, Discrete) and not space.start <= int(a) < space.start + space.n:
        raise error(f"{what}: {int(a)} outside Discrete({space.n}, start={space.start})")
    if isinstance(space, MultiDiscrete) and np.any((a < 0) | (a >= space.nvec)):
        raise error(f"{what}: {a.tolist()} outside MultiDiscrete({space.nvec.tolist()})")
    if isinstance(space, Box) and a.dtype.kind == "f":
        if np.isnan(a).any():
            raise error(f"{what}: contains NaN")
        if not (np.isfinite(a) | np.isinf(space.low) | np.isinf(space.high)).all():
            raise error(f"{what}: contains an infinite value where {space!r} is bounded")


_all, _any = np.logical_and.reduce, np.logical_or.reduce


class ValueChecker:
    """:func:`check_value` precomputed for one space, for per-step hot paths.

    Fast path: an ndarray of a :class:`Box`'s exact shape (and, with ``values``, exact
    dtype) is checked only for what the box cannot hold (NaN; infinities where a bound is
    finite) and copied (``values``) or cast if needed (without ``values``); anything else
    goes through :func:`check_value` with the same arguments.

    Args:
        space: the space every value must belong to.
        values: as in :func:`check_value`.
        error: as in :func:`check_value`.
    """

    __slots__ = ("space", "values", "error", "_shape", "_dtype", "_mode", "_unbounded")

    def __init__(self, space: Space, *, values: bool = True, error: type[Exception] = ValueError):
        self.space, self.values, self.error = space, values, error
        self._shape: tuple[int, ...] | None = None
        self._dtype: np.dtype | None = None
        self._mode = "none"  # no fast path
        self._unbounded: np.ndarray | None = None
        if isinstance(space, Box):
            self._shape, self._dtype, self._mode = tuple(space.shape), space.dtype, "any"
            if values and space.dtype.kind == "f":
                unbounded = np.isinf(space.low) | np.isinf(space.high)
                self._mode = (
                    "nan" if unbounded.all() else ("finite" if not unbounded.any() else "mask")
                )
                self._unbounded = unbounded

    def __call__(self, x: Any, kind: str, key: Any) -> Any:
        """``x`` checked; ``kind`` and ``key`` name it in an error message (``kind[key]``)."""
        if type(x) is np.ndarray and x.shape == self._shape:
            mode = self._mode
            if not self.values:
                if x.dtype == self._dtype:
                    return x
            elif x.dtype == self._dtype and (
                # ufunc reductions directly (ndarray.all/any go through a Python wrapper)
                mode == "any"
                or (mode == "finite" and _all(np.isfinite(x), axis=None))
                or (mode == "nan" and not _any(np.isnan(x), axis=None))
                or (
                    mode == "mask"
                    and _all(np.isfinite(x) | (self._unbounded & ~np.isnan(x)), axis=None)
                )
            ):
                return x.copy()
        return check_value(x, self.space, f"{kind}[{key!r}]", values=self.values, error=self.error)
