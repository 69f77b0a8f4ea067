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
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, BinaryIO

import msgpack
import numpy as np

from jaxsampler import spaces as sp
from jaxsampler.episodes.batch import MultiAgentBatch, SampleBatch
from jaxsampler.episodes.lookback import InfiniteLookbackBuffer
from jaxsampler.episodes.multi_agent import MultiAgentEpisode, default_agent_to_module_mapping_fn
from jaxsampler.episodes.single_agent import SingleAgentEpisode

__all__ = ["packb", "unpackb", "unpacker"]

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
        return ["SampleBatch", [dict(dict.items(obj)), attrs]]
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


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind == "O":
            return msgpack.ExtType(_OBJARRAY, packb([list(obj.shape), obj.ravel().tolist()]))
        return msgpack.ExtType(_ARRAY, packb(_array_payload(obj)))
    if isinstance(obj, np.generic):
        return msgpack.ExtType(_SCALAR, packb(_array_payload(np.asarray(obj))))
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


# -- decoding --------------------------------------------------------------------------


def _array(payload: list) -> np.ndarray:
    dtype_str, shape, raw = payload
    dtype = np.dtype(dtype_str)
    if dtype.kind in "OV":
        raise ValueError(f"refusing numpy dtype {dtype}")
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


def _space(args: list) -> sp.Space:
    kind = args[0]
    if kind == "Box":
        return sp.Box(args[1], args[2], tuple(args[3]), np.dtype(args[4]))
    if kind == "Discrete":
        return sp.Discrete(args[1], args[2], np.dtype(args[3]))
    if kind == "MultiDiscrete":
        return sp.MultiDiscrete(args[1], np.dtype(args[2]))
    if kind == "Dict":
        return sp.Dict(args[1])
    if kind == "Tuple":
        return sp.Tuple(args[1])
    raise ValueError(f"unknown space kind {kind!r}")


def _object(tag: str, state: Any) -> Any:
    if tag == "SampleBatch":
        cols, attrs = state
        b = SampleBatch(
            _time_major=attrs["time_major"],
            _max_seq_len=attrs["max_seq_len"],
            _zero_padded=attrs["zero_padded"],
            _is_training=attrs["is_training"],
            _num_grad_updates=attrs["num_grad_updates"],
        )
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
        return defaultdict(_FACTORY_BY_NAME[state[0]], state[1])
    if tag == "set":
        return set(state)
    if tag == "dict":
        return dict(state)
    raise ValueError(f"unknown object tag {tag!r}")


def _make_ext_hook(objects: bool):
    def hook(code: int, data: bytes) -> Any:
        if code == _ARRAY:
            return _array(_unpack(data, hook))
        if code == _SCALAR:
            return _array(_unpack(data, hook))[()]
        if code == _TUPLE:
            return tuple(_unpack(data, hook))
        if code == _OBJARRAY:
            shape, items = _unpack(data, hook)
            out = np.empty(len(items), dtype=object)
            for i, v in enumerate(items):  # item by item: lists must not broadcast
                out[i] = v
            return out.reshape(shape)
        if code == _SPACE:
            return _space(_unpack(data, hook))
        if code == _OBJECT and objects:
            tag, state = _unpack(data, hook)
            return _object(tag, state)
        raise ValueError(f"unsupported msgpack ext type {code}")

    return hook


def _unpack(data: bytes, hook: Any) -> Any:
    return msgpack.unpackb(data, ext_hook=hook, raw=False, strict_map_key=False)


_HOOK_ALL, _HOOK_DATA = _make_ext_hook(True), _make_ext_hook(False)


def unpackb(data: bytes, *, objects: bool = True) -> Any:
    """Decodes :func:`packb` output. ``objects=False`` refuses batches and episodes
    (plain data only: what the policy server accepts from clients). Raises ``ValueError``
    (or a msgpack error, a ``ValueError`` subclass) on malformed input."""
    try:
        return _unpack(data, _HOOK_ALL if objects else _HOOK_DATA)
    except Exception as e:
        raise ValueError(f"malformed msgpack data ({type(e).__name__}: {e})") from e


def unpacker(f: BinaryIO) -> msgpack.Unpacker:
    """A streaming decoder of consecutive :func:`packb` frames read from ``f``."""
    return msgpack.Unpacker(
        f, ext_hook=_HOOK_ALL, raw=False, strict_map_key=False, max_buffer_size=2**31 - 1
    )
