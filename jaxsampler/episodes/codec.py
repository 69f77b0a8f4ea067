"""The wire codec: msgpack with exact numpy arrays, shared by the policy server's
protocol (:mod:`jaxsampler.serving`) and offline logs (:mod:`jaxsampler.offline`).

Why msgpack: arrays travel as their raw bytes plus dtype and shape, so a round trip is
bit-exact (float32 stays float32, NaNs and -0.0 survive) and cheap (no base64, no text
formatting); it streams without an index; the ``msgpack`` package is small, stable,
maintained, and already installed with flax (whose checkpoint format uses it); readers
exist for every language. msgpack ext types used:

==== ==================================================================================
code payload
==== ==================================================================================
1    numpy array: ``[dtype.str, shape, raw C-order bytes]`` (no object / void dtypes)
2    numpy scalar: same payload as a 0-d array
3    tuple: the items as a msgpack array
4    object array: ``[shape, items in C order]``
5    jaxsampler space: ``[class name, constructor arguments...]``
6    host object: ``[tag, state]`` for SampleBatch, MultiAgentBatch, SingleAgentEpisode,
     MultiAgentEpisode, InfiniteLookbackBuffer, defaultdict, set
==== ==================================================================================

Dicts may have any hashable keys (str, int, tuple). jax arrays are written as numpy
arrays. ``MultiAgentEpisode.agent_to_module_mapping_fn`` (a function) is not stored: the
episode's resolved agent -> module ids are, and a decoded episode uses the default
mapping function for agents it has not seen.

Decoding is safe on untrusted input: it costs memory and time linear in the input and
never recurses as deep as the input asks. :func:`scan` first walks the document with an
explicit stack, ext payloads included, and refuses nesting deeper than :data:`MAX_DEPTH`
(64) levels in all, unknown ext types, and (for ``objects=False``, the policy server's
request decoder) spaces and host objects, before anything is built. Then each array's
dtype and shape must account for its raw bytes exactly before it is allocated (an
optional ``max_array_bytes`` caps all arrays together), and a decoded space may have at
most :data:`MAX_SPACE_ELEMENTS` elements. Every failure is a :class:`DecodeError`, a
``ValueError`` whose message says what was wrong; the encoder's output is unchanged.
"""

from __future__ import annotations

import functools
import math
import re
import reprlib
from collections import defaultdict
from typing import Any, BinaryIO

import msgpack
import numpy as np

from jaxsampler import spaces as sp
from jaxsampler.episodes.batch import MultiAgentBatch, SampleBatch
from jaxsampler.episodes.lookback import InfiniteLookbackBuffer
from jaxsampler.episodes.multi_agent import MultiAgentEpisode, default_agent_to_module_mapping_fn
from jaxsampler.episodes.single_agent import SingleAgentEpisode

__all__ = [
    "MAX_DEPTH",
    "MAX_NDIM",
    "MAX_SPACE_ELEMENTS",
    "DecodeError",
    "TruncatedDataError",
    "Unpacker",
    "packb",
    "scan",
    "unpackb",
    "unpacker",
]

_ARRAY, _SCALAR, _TUPLE, _OBJARRAY, _SPACE, _OBJECT = 1, 2, 3, 4, 5, 6

_FACTORIES: dict[Any, str] = {
    int: "int",
    float: "float",
    dict: "dict",
    list: "list",
    InfiniteLookbackBuffer: "InfiniteLookbackBuffer",
}
_FACTORY_BY_NAME = {v: k for k, v in _FACTORIES.items()}


# -- encoding --------------------------------------------------------------------------


def _array_payload(a: np.ndarray) -> list:
    if a.dtype.kind in "OV":
        raise TypeError(f"cannot encode numpy dtype {a.dtype}")
    return [a.dtype.str, list(a.shape), np.ascontiguousarray(a).tobytes()]


def _space_args(s: sp.Space) -> list:
    if isinstance(s, sp.Box):
        return ["Box", s.low, s.high, list(s.shape), s.dtype.str]
    if isinstance(s, sp.Discrete):
        return ["Discrete", s.n, s.start, s.dtype.str]
    if isinstance(s, sp.MultiDiscrete):
        return ["MultiDiscrete", s.nvec, s.dtype.str]
    if isinstance(s, sp.Dict):
        return ["Dict", dict(s.spaces)]
    if isinstance(s, sp.Tuple):
        return ["Tuple", list(s.spaces)]
    raise TypeError(f"cannot encode space {s!r}")


def _object_state(obj: Any) -> list:
    if isinstance(obj, SampleBatch):
        attrs = {
            "time_major": obj.time_major,
            "max_seq_len": obj.max_seq_len,
            "zero_padded": obj.zero_padded,
            "is_training": obj.is_training,
            "num_grad_updates": obj.num_grad_updates,
            "count": obj.count,
        }
        return ["SampleBatch", [dict(obj.items()), attrs]]  # (items(): builds deferred columns)
    if isinstance(obj, MultiAgentBatch):
        return ["MultiAgentBatch", [obj.policy_batches, obj.count]]
    if isinstance(obj, SingleAgentEpisode):
        return ["SingleAgentEpisode", obj.get_state()]
    if isinstance(obj, MultiAgentEpisode):
        state = obj.get_state()
        fn = state.pop("agent_to_module_mapping_fn")
        state["agent_to_module_mapping_fn"] = (
            None
            if fn is default_agent_to_module_mapping_fn
            else getattr(fn, "__qualname__", repr(fn))
        )
        return ["MultiAgentEpisode", state]
    if isinstance(obj, InfiniteLookbackBuffer):
        return ["InfiniteLookbackBuffer", obj.get_state()]
    if isinstance(obj, defaultdict):
        name = _FACTORIES.get(obj.default_factory)
        if name is None:
            raise TypeError(f"cannot encode a defaultdict with factory {obj.default_factory!r}")
        return ["defaultdict", [name, dict(obj)]]
    if isinstance(obj, (set, frozenset)):
        return ["set", list(obj)]
    if isinstance(obj, dict):  # other dict subclasses (OrderedDict, ...) as plain dicts
        return ["dict", dict(obj)]
    raise TypeError(f"cannot encode object of type {type(obj).__name__}")


#: ``(dtype str, shape) -> the encoded start of an array's payload`` (its msgpack array
#: header, dtype and shape), so an array of a known kind encodes without a nested packb
_HEADS: dict[tuple[np.dtype, tuple[int, ...]], bytes] = {}
_MAX_HEADS = 4096


def _array_bytes(a: np.ndarray) -> bytes:
    """``packb(_array_payload(a))``, byte for byte, from a cached head and the data."""
    key = (a.dtype, a.shape)
    head = _HEADS.get(key)
    if head is None:
        if a.dtype.kind in "OV":
            raise TypeError(f"cannot encode numpy dtype {a.dtype}")
        if len(_HEADS) >= _MAX_HEADS:
            _HEADS.clear()
        head = _HEADS[key] = b"\x93" + packb(a.dtype.str) + packb(list(a.shape))
    data = a.tobytes()  # (C order, as np.ascontiguousarray(a).tobytes())
    n = len(data)
    if n < 0x100:
        return b"".join((head, b"\xc4", n.to_bytes(1, "big"), data))
    if n < 0x10000:
        return b"".join((head, b"\xc5", n.to_bytes(2, "big"), data))
    if n < 0x100000000:
        return b"".join((head, b"\xc6", n.to_bytes(4, "big"), data))
    return packb(_array_payload(a))  # (msgpack's own error over 4 GiB)


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind == "O":
            return msgpack.ExtType(_OBJARRAY, packb([list(obj.shape), obj.ravel().tolist()]))
        return msgpack.ExtType(_ARRAY, _array_bytes(obj))
    if isinstance(obj, np.generic):
        # (as a 0-d array: an empty str_ / bytes_ scalar's own dtype is <U0 / |S0, which
        # the decoder refuses; np.asarray gives <U1 / |S1, as the payload always had)
        return msgpack.ExtType(_SCALAR, _array_bytes(np.asarray(obj)))
    if isinstance(obj, tuple):
        return msgpack.ExtType(_TUPLE, packb(list(obj)))
    if isinstance(obj, sp.Space):
        return msgpack.ExtType(_SPACE, packb(_space_args(obj)))
    if type(obj).__module__.startswith(("jax", "jaxlib")) and hasattr(obj, "__array__"):
        return _default(np.asarray(obj))
    if isinstance(obj, float):  # float subclasses other than np.float64
        return float(obj)
    if isinstance(obj, int) and not isinstance(obj, bool):
        return int(obj)
    if isinstance(obj, str):
        return str(obj)
    if isinstance(obj, list):
        return list(obj)
    return msgpack.ExtType(_OBJECT, packb(_object_state(obj)))


def packb(obj: Any) -> bytes:
    """Encodes ``obj`` (nested dicts/lists/tuples of numbers, strings, bytes, numpy/jax
    arrays and scalars, spaces, batches, episodes) as msgpack bytes."""
    return msgpack.packb(obj, default=_default, strict_types=True, use_bin_type=True)


# -- limits and errors -----------------------------------------------------------------

#: Deepest nesting a decoded document may have. Every msgpack array, map and ext value
#: counts one level and an ext value's payload nests inside it: a SampleBatch record
#: needs 7 levels, a multi-agent episode about 16.
MAX_DEPTH = 64
#: Most elements a decoded space may have (a Box shape's product, a MultiDiscrete's size).
MAX_SPACE_ELEMENTS = 2**24
#: Most dimensions a decoded array may have (numpy's own limit is 64).
MAX_NDIM = 32
_MAX_DIM = 2**62

# dtype strings as ``np.dtype.str`` writes them: "<f4", "|b1", "<U7", "<M8[ns]".
_DTYPE_RE = re.compile(r"[<>|=]?[a-zA-Z]\d{0,10}(\[\d{0,10}[a-zA-Z]{1,3}\])?")
_DTYPE_KINDS = "biufcSUMm"  # no object ("O") or void/structured ("V") dtypes
# Decoded values quoted in error messages: short, and never deeply recursive.
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlist = 3, 40, 40, 8
_r = _REPR.repr
_EXT_CODES = frozenset((_ARRAY, _SCALAR, _TUPLE, _OBJARRAY, _SPACE, _OBJECT))


class DecodeError(ValueError):
    """Malformed or refused msgpack input: too deep, an array whose byte count does not
    match its dtype and shape, a refused ext type, a budget exceeded. The message says
    what was wrong and, for structural errors, at which byte offset."""


class TruncatedDataError(DecodeError):
    """The input ends inside a document (more bytes could complete it)."""


# -- validating scan: no allocation, no recursion ---------------------------------------

_FIXED_SIZE = {0xC0: 1, 0xC2: 1, 0xC3: 1, 0xCA: 5, 0xCB: 9}  # nil, false, true, floats
_FIXED_SIZE.update({b: 1 + (1 << (b & 3)) for b in range(0xCC, 0xD4)})  # (u)int 8..64
_BIN_STR = {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4}  # -> size of length
_EXT_LEN = {0xC7: 1, 0xC8: 2, 0xC9: 4}  # ext 8/16/32 -> size of length
_FIXEXT = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}  # -> payload length
_COUNTED = {0xDC: (2, 1), 0xDD: (4, 1), 0xDE: (2, 2), 0xDF: (4, 2)}  # -> (size, per item)


def scan(
    data: bytes | bytearray | memoryview,
    offset: int = 0,
    *,
    objects: bool = True,
    spaces: bool | None = None,
    max_depth: int = MAX_DEPTH,
) -> int:
    """Checks the msgpack document that starts at ``offset`` and returns where it ends.

    Walks the bytes with an explicit stack (nothing is built and nothing recurses), and
    descends into the payloads of jaxsampler's ext values, so the depth of the whole
    document, containers and ext values together, is known before anything is decoded.
    Cost: O(number of msgpack items), independent of the size of strings and binaries.

    Args:
        data: the bytes; the document may be followed by more bytes.
        offset: where the document starts.
        objects: when false, host objects (ext 6) are refused, and spaces too unless
            ``spaces`` is true.
        spaces: whether spaces (ext 5) are allowed; ``None``: as ``objects``.
        max_depth: the deepest nesting allowed (see :data:`MAX_DEPTH`).

    Raises:
        TruncatedDataError: ``data`` ends inside the document.
        DecodeError: anything else malformed or refused: nesting deeper than
            ``max_depth``, an unknown ext type, an ext payload that is not exactly one
            document, the unused byte 0xc1.
    """
    refused = _refused(objects, spaces)
    buf = data if isinstance(data, (bytes, bytearray)) else memoryview(data).cast("B")
    end = len(buf)
    pos = offset
    stack: list[tuple[int, int, bool]] = []  # enclosing levels: (items left, limit, ext)
    left, limit, ext_open = 1, end, 0  # items left here; where this level must end

    while True:
        if left == 0:
            if not stack:
                return pos
            left, outer, is_ext = stack.pop()
            if is_ext:
                if pos != limit:
                    raise DecodeError(f"ext payload has extra bytes at {pos}..{limit}")
                ext_open -= 1
            limit = outer
            continue
        if pos >= limit:
            raise _short(ext_open, limit, end)
        b = buf[pos]
        left -= 1
        n, container, at = 0, False, pos
        if b <= 0x7F or b >= 0xE0:  # fixints
            pos += 1
            continue
        if 0xA0 <= b <= 0xBF:  # fixstr
            pos += 1 + (b & 0x1F)
        elif b <= 0x9F:  # fixmap, fixarray
            n = (b & 0x0F) * (2 if b <= 0x8F else 1)
            pos += 1
            container = True
        elif b in _FIXED_SIZE:
            pos += _FIXED_SIZE[b]
        elif b in _BIN_STR or b in _COUNTED:
            size, per = (_BIN_STR[b], 0) if b in _BIN_STR else _COUNTED[b]
            if pos + 1 + size > limit:
                raise _short(ext_open, limit, end)
            count = int.from_bytes(buf[pos + 1 : pos + 1 + size], "big")
            pos += 1 + size
            if per:
                n, container = count * per, True
            else:
                pos += count
        elif b in _EXT_LEN or b in _FIXEXT:
            size = _EXT_LEN.get(b, 0)
            if pos + 2 + size > limit:
                raise _short(ext_open, limit, end)
            length = (
                _FIXEXT[b] if size == 0 else int.from_bytes(buf[pos + 1 : pos + 1 + size], "big")
            )
            start = pos + 2 + size
            if start + length > limit:
                raise _short(ext_open, limit, end)
            code = int.from_bytes(buf[start - 1 : start], "big", signed=True)
            if code not in _EXT_CODES:
                raise DecodeError(f"unsupported msgpack ext type {code} at byte {pos}")
            if code in refused:
                what = "space" if code == _SPACE else "host object"
                raise DecodeError(
                    f"refusing a {what} (msgpack ext type {code}) at byte {pos}: plain "
                    f"data only here (objects=False{', spaces=False' if code == _SPACE else ''})"
                )
            if code in (_ARRAY, _SCALAR):
                # A leaf: its payload ([dtype, shape, bytes], 2 levels) is decoded without
                # ext values and its structure checked by the decoder, so skip it here.
                if len(stack) + 3 > max_depth:
                    raise DecodeError(f"nesting deeper than {max_depth} levels at byte {pos}")
                pos = start + length
                continue
            if len(stack) >= max_depth:
                raise DecodeError(f"nesting deeper than {max_depth} levels at byte {pos}")
            stack.append((left, limit, True))
            left, limit, pos = 1, start + length, start
            ext_open += 1
            continue
        else:
            raise DecodeError(f"invalid msgpack byte 0x{b:02x} at byte {pos}")
        if pos > limit:
            raise _short(ext_open, limit, end)
        if container:
            if len(stack) >= max_depth:
                raise DecodeError(f"nesting deeper than {max_depth} levels at byte {at}")
            if n > limit - pos:  # every item takes at least one byte
                raise _short(ext_open, limit, end)
            stack.append((left, limit, False))
            left = n


def _refused(objects: bool, spaces: bool | None) -> frozenset[int]:
    """The ext codes refused for these switches."""
    allow_spaces = objects if spaces is None else spaces
    return frozenset(([] if objects else [_OBJECT]) + ([] if allow_spaces else [_SPACE]))


def _short(ext_open: int, limit: int, end: int) -> DecodeError:
    if ext_open:
        return DecodeError(f"ext payload ending at byte {limit} is incomplete")
    return TruncatedDataError(f"input ends inside a document (at byte {end})")


# -- decoding ---------------------------------------------------------------------------


def _dims(shape: Any, what: str) -> tuple[int, ...]:
    if not isinstance(shape, (list, tuple)) or len(shape) > MAX_NDIM:
        raise DecodeError(
            f"{what}: shape must be a list of at most {MAX_NDIM} ints, got {_r(shape)}"
        )
    if not all(type(d) is int and 0 <= d < _MAX_DIM for d in shape):
        raise DecodeError(f"{what}: shape must hold ints in [0, 2**62), got {_r(shape)}")
    return tuple(shape)


def _size(dims: tuple[int, ...]) -> int:
    return math.prod(dims)


def _dtype(name: Any, what: str, kinds: str = _DTYPE_KINDS) -> np.dtype:
    dtype = _parse_dtype(name) if isinstance(name, str) else None
    if dtype is None:
        raise DecodeError(
            f"{what}: bad dtype {_r(name)} (expected a numpy dtype string like '<f4')"
        )
    if dtype.kind not in kinds or dtype.itemsize == 0:
        raise DecodeError(f"{what}: refusing numpy dtype {dtype} (allowed kinds: {kinds})")
    return dtype


@functools.lru_cache(maxsize=256)
def _parse_dtype(name: str) -> np.dtype | None:
    """``np.dtype(name)`` for the plain dtype strings ``np.dtype.str`` writes, else None
    (cached: each array of a record repeats one of a few names)."""
    if _DTYPE_RE.fullmatch(name) is None:
        return None
    try:
        return np.dtype(name)
    except TypeError:
        return None


def _no_ext(code: int, data: bytes) -> Any:
    raise DecodeError(f"an array payload holds a msgpack ext value (type {code})")


class _Decoder:
    """Decodes ext payloads of one document; holds its array-bytes budget.

    Recursion through ``msgpack.unpackb`` is bounded: :func:`scan` has checked the whole
    document's depth before the first call."""

    def __init__(
        self,
        refused: frozenset[int],
        max_array_bytes: int | None,
        max_space_elements: int,
        max_bytes_per_array: int | None = None,
    ):
        self.refused = refused
        self.budget = max_array_bytes
        self.per_array = max_bytes_per_array
        self.max_space_elements = max_space_elements

    def unpack(self, data: bytes, leaf: bool = False) -> Any:
        """One document; ``leaf``: an array payload, where no ext value may appear."""
        n = len(data)
        return msgpack.unpackb(
            data,
            ext_hook=_no_ext if leaf else self.hook,
            raw=False,
            strict_map_key=False,
            max_str_len=n,
            max_bin_len=n,
            max_array_len=n,
            max_map_len=n // 2,
            max_ext_len=n,
        )

    def hook(self, code: int, data: bytes) -> Any:
        try:
            return self._ext(code, data)
        except DecodeError:
            raise
        except Exception as e:  # a malformed payload: wrong types, wrong counts, ...
            raise DecodeError(
                f"bad msgpack ext type {code} payload ({type(e).__name__}: {e})"
            ) from e

    def _ext(self, code: int, data: bytes) -> Any:
        if code in (_ARRAY, _SCALAR):
            a = self._array(self.unpack(data, leaf=True), "array" if code == _ARRAY else "scalar")
            if code == _SCALAR:
                if a.ndim:
                    raise DecodeError(f"scalar: shape must be [], got {list(a.shape)}")
                return a[()]
            return a
        if code == _TUPLE:
            return tuple(self._list(self.unpack(data), "tuple"))
        if code == _OBJARRAY:
            shape, items = self._list(self.unpack(data), "object array", 2)
            dims, items = _dims(shape, "object array"), self._list(items, "object array")
            if _size(dims) != len(items):
                raise DecodeError(
                    f"object array: shape {list(dims)} does not hold {len(items)} items"
                )
            out = np.empty(len(items), dtype=object)
            for i, v in enumerate(items):  # item by item: lists must not broadcast
                out[i] = v
            return out.reshape(dims)
        if code in self.refused:
            raise DecodeError(f"refusing msgpack ext type {code} here")
        if code == _SPACE:
            return self._space(self.unpack(data))
        if code == _OBJECT:
            tag, state = self._list(self.unpack(data), "host object", 2)
            return _object(tag, state)
        raise DecodeError(f"unsupported msgpack ext type {code}")

    @staticmethod
    def _list(x: Any, what: str, n: int | None = None) -> list:
        if not isinstance(x, list) or (n is not None and len(x) != n):
            want = "a list" if n is None else f"a list of {n} items"
            raise DecodeError(f"{what}: payload must be {want}, got {type(x).__name__}")
        return x

    def _array(self, payload: Any, what: str) -> np.ndarray:
        dtype_str, shape, raw = self._list(payload, what, 3)
        dtype, dims = _dtype(dtype_str, what), _dims(shape, what)
        if not isinstance(raw, bytes):
            raise DecodeError(f"{what}: data must be bytes, got {type(raw).__name__}")
        want = _size(dims) * dtype.itemsize  # checked before anything is allocated
        if want != len(raw):
            raise DecodeError(
                f"{what}: dtype {dtype.str} and shape {list(dims)} need {want} bytes, "
                f"the data has {len(raw)}"
            )
        if self.per_array is not None and want > self.per_array:
            raise DecodeError(f"{what}: {want} bytes exceed max_bytes_per_array={self.per_array}")
        if self.budget is not None:
            self.budget -= len(raw)
            if self.budget < 0:
                raise DecodeError("arrays exceed max_array_bytes")
        return np.frombuffer(raw, dtype=dtype).reshape(dims).copy()

    def _space(self, args: Any) -> sp.Space:
        args = self._list(args, "space")
        kind, rest = (args[0], args[1:]) if args else (None, [])
        limit = self.max_space_elements
        if kind == "Box" and len(rest) == 4:
            low, high, shape, dtype = rest
            dims = _dims(shape, "Box")
            if _size(dims) > limit:
                raise DecodeError(f"Box: shape {list(dims)} has more than {limit} elements")
            for bound in (low, high):
                b = np.asarray(bound) if isinstance(bound, (int, float, np.ndarray)) else None
                if isinstance(bound, bool) or b is None or b.dtype.kind not in "biuf":
                    raise DecodeError(
                        f"Box: bounds must be real numbers or arrays, got {_r(bound)}"
                    )
                if b.size > limit or (b.dtype.kind == "f" and np.isnan(b).any()):
                    raise DecodeError("Box: bounds must not be NaN or larger than the shape")
            return sp.Box(low, high, dims, _dtype(dtype, "Box", "biuf"))
        if kind == "Discrete" and len(rest) == 3:
            n, start, dtype = rest
            if type(n) is not int or type(start) is not int:
                raise DecodeError(f"Discrete: n and start must be ints, got {_r(n)}, {_r(start)}")
            return sp.Discrete(n, start, _dtype(dtype, "Discrete", "iu"))
        if kind == "MultiDiscrete" and len(rest) == 2:
            nvec, dtype = rest
            if not isinstance(nvec, np.ndarray) or nvec.dtype.kind not in "iu" or nvec.size > limit:
                raise DecodeError(
                    f"MultiDiscrete: nvec must be an int array of at most {limit} elements"
                )
            return sp.MultiDiscrete(nvec, _dtype(dtype, "MultiDiscrete", "iu"))
        if kind == "Dict" and len(rest) == 1 and isinstance(rest[0], dict):
            if not all(isinstance(k, str) and isinstance(v, sp.Space) for k, v in rest[0].items()):
                raise DecodeError("Dict space: keys must be str and values spaces")
            return sp.Dict(rest[0])
        if kind == "Tuple" and len(rest) == 1 and isinstance(rest[0], list):
            if not all(isinstance(v, sp.Space) for v in rest[0]):
                raise DecodeError("Tuple space: items must be spaces")
            return sp.Tuple(rest[0])
        raise DecodeError(f"unknown space {_r(kind)} with {len(rest)} arguments")


def _object(tag: Any, state: Any) -> Any:
    if tag == "SampleBatch":
        cols, attrs = state
        b = SampleBatch(
            _time_major=attrs["time_major"],
            _max_seq_len=attrs["max_seq_len"],
            _zero_padded=attrs["zero_padded"],
            _is_training=attrs["is_training"],
            _num_grad_updates=attrs["num_grad_updates"],
        )
        if not isinstance(cols, dict):
            raise DecodeError(f"SampleBatch: columns must be a dict, got {type(cols).__name__}")
        dict.update(b, cols)
        b.count = attrs["count"]
        return b
    if tag == "MultiAgentBatch":
        return MultiAgentBatch(state[0], state[1])
    if tag == "SingleAgentEpisode":
        return SingleAgentEpisode.from_state(state)
    if tag == "MultiAgentEpisode":
        state = dict(state)
        state["agent_to_module_mapping_fn"] = default_agent_to_module_mapping_fn
        return MultiAgentEpisode.from_state(state)
    if tag == "InfiniteLookbackBuffer":
        return InfiniteLookbackBuffer.from_state(state)
    if tag == "defaultdict":
        if state[0] not in _FACTORY_BY_NAME:
            raise DecodeError(f"defaultdict: unknown factory {_r(state[0])}")
        return defaultdict(_FACTORY_BY_NAME[state[0]], state[1])
    if tag == "set":
        return set(state)
    if tag == "dict":
        return dict(state)
    raise DecodeError(f"unknown object tag {_r(tag)}")


def unpackb(
    data: bytes | bytearray | memoryview,
    *,
    objects: bool = True,
    spaces: bool | None = None,
    max_depth: int = MAX_DEPTH,
    max_array_bytes: int | None = None,
    max_space_elements: int = MAX_SPACE_ELEMENTS,
    max_bytes_per_array: int | None = None,
) -> Any:
    """Decodes one :func:`packb` document, in memory and time linear in ``len(data)``.

    The document is first checked by :func:`scan` (depth, structure, ext types), then
    decoded; every array's dtype and shape must account for its bytes exactly before it
    is allocated.

    Args:
        data: exactly one document.
        objects: ``False`` decodes plain data only (what the policy server accepts from
            clients): host objects (batches, episodes, sets, ...) are refused, and so
            are spaces unless ``spaces`` is true.
        spaces: whether spaces are decoded; ``None`` (default): as ``objects``. A client
            reading a server's ``/info`` uses ``objects=False, spaces=True``.
        max_depth: the deepest nesting allowed, ext payloads included.
        max_array_bytes: most bytes all decoded arrays may hold together (``None``: no
            limit beyond the input's own size).
        max_space_elements: most elements of a decoded space.
        max_bytes_per_array: most bytes of any one decoded array (``None``: no limit); the
            policy server refuses observations larger than its spaces with it.

    Raises:
        DecodeError: (a ``ValueError``) malformed, truncated or refused input; the message
        says what was wrong.
    """
    try:
        end = scan(data, objects=objects, spaces=spaces, max_depth=max_depth)
    except DecodeError as e:
        raise type(e)(f"malformed msgpack data: {e}") from None
    if end != len(data):
        raise DecodeError(f"malformed msgpack data: extra bytes after the document at byte {end}")
    return _decode(
        data, _refused(objects, spaces), max_array_bytes, max_space_elements, max_bytes_per_array
    )


def _decode(
    data: bytes | bytearray | memoryview,
    refused: frozenset[int],
    max_array_bytes: int | None,
    max_space_elements: int,
    max_bytes_per_array: int | None = None,
) -> Any:
    """Decodes one document that :func:`scan` has accepted (so its depth is bounded)."""
    decoder = _Decoder(refused, max_array_bytes, max_space_elements, max_bytes_per_array)
    try:
        return decoder.unpack(bytes(data))
    except DecodeError:
        raise
    except Exception as e:  # msgpack's own errors, objects' constructors
        raise DecodeError(f"malformed msgpack data ({type(e).__name__}: {e})") from e


class Unpacker:
    """Decodes consecutive :func:`packb` documents read from a binary file, one at a time.

    Iterate over it. :attr:`offset` is where the next document starts (bytes read from the
    file's position at construction). Reads in chunks; memory grows only with the largest
    document. Raises :class:`TruncatedDataError` when the file ends inside a document
    and :class:`DecodeError` on anything malformed; both name the byte offset.
    """

    def __init__(
        self,
        f: BinaryIO,
        *,
        objects: bool = True,
        spaces: bool | None = None,
        max_depth: int = MAX_DEPTH,
        max_array_bytes: int | None = None,
        max_space_elements: int = MAX_SPACE_ELEMENTS,
        chunk_size: int = 1 << 16,
    ):
        self._f, self._chunk = f, chunk_size
        self._objects, self._spaces, self._max_depth = objects, spaces, max_depth
        self._limits = (max_array_bytes, max_space_elements)
        self._buf, self._pos, self._base, self._eof = b"", 0, 0, False

    @property
    def offset(self) -> int:
        """Bytes consumed so far, counted from the start of the stream."""
        return self._base + self._pos

    def __iter__(self) -> Unpacker:
        return self

    def __next__(self) -> Any:
        while True:
            if self._pos == len(self._buf) and self._eof:
                raise StopIteration
            try:
                end = scan(
                    self._buf,
                    self._pos,
                    objects=self._objects,
                    spaces=self._spaces,
                    max_depth=self._max_depth,
                )
                break
            except TruncatedDataError:
                if self._eof:
                    raise TruncatedDataError(
                        f"input ends inside the document at byte {self.offset} "
                        f"({len(self._buf) - self._pos} bytes left)"
                    ) from None
            except DecodeError as e:
                raise type(e)(f"in the document at byte {self.offset}: {e}") from None
            self._fill()
        doc = self._buf[self._pos : end]
        try:
            obj = _decode(doc, _refused(self._objects, self._spaces), *self._limits)
        except DecodeError as e:
            raise type(e)(f"in the document at byte {self.offset}: {e}") from None
        self._pos = end
        return obj

    def _fill(self) -> None:
        if self._pos:
            self._base += self._pos
            self._buf, self._pos = self._buf[self._pos :], 0
        more = self._f.read(max(self._chunk, len(self._buf)))  # doubling: linear time
        if not more:
            self._eof = True
        self._buf += more


def unpacker(f: BinaryIO, **limits: Any) -> Unpacker:
    """A streaming decoder of consecutive :func:`packb` documents read from ``f``: an
    :class:`Unpacker` (iterate over it). ``limits`` are :func:`unpackb`'s keyword-only
    arguments (``objects``, ``spaces``, ``max_depth``, ``max_array_bytes``,
    ``max_space_elements``)."""
    return Unpacker(f, **limits)
