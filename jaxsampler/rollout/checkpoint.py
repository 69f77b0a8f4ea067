"""Checkpoints on disk with orbax: pytrees of arrays, a host-side blob, a JSON header.

One checkpoint is one directory written by orbax-checkpoint (the JAX ecosystem's
checkpoint library). It holds up to three parts:

* ``arrays``: a pytree of arrays (``jax.Array`` leaves keep their shardings: a state
  split over a mesh is written shard by shard and restored onto the target's layout);
* ``host``: bytes of host-side Python state (a sampler's open episode chunks), written
  with :func:`dump_host` and read back with :func:`load_host`, which only rebuilds
  numpy arrays, builtin containers and jaxsampler's own classes (a checkpoint cannot
  run code on load) and checks a SHA-256 digest first;
* ``meta``: a JSON header (format version, what wrote it, a fingerprint of its
  configuration) that :func:`read_meta` reads without touching the arrays.

Writes are atomic: orbax writes into a temporary directory next to the target and
renames it into place once everything is on disk, so a writer killed mid-save leaves no
half-written checkpoint under the target's name (the previous one, in a
:class:`Checkpoints` directory, stays loadable). Every failure to read a checkpoint
(missing, truncated, corrupt, of another configuration) is a :class:`CheckpointError`
naming the path and the problem.

The pure path (inside your own training loop)::

    js.rollout.checkpoint.save(path, {"rollout": state, "params": params, "opt": opt_state})
    tree = js.rollout.checkpoint.restore(path, like={"rollout": state, "params": params, ...})

``like`` fixes the structure (dataclasses such as ``RolloutState`` and optax's named
tuples come back as themselves), dtypes and shardings; its values are not used
(abstract ``jax.ShapeDtypeStruct`` leaves work too). A ``like`` leaf on a mesh restores
onto the same sharding (each device reads its shards); an uncommitted array (a fresh
one, not placed with ``jax.device_put(x, device)``) or a ``ShapeDtypeStruct`` without
a sharding comes back uncommitted on the default device, so it mixes with arrays on
any device as the original did. Without ``like`` the leaves come back as numpy arrays
in the saved structure (dataclasses and named tuples as dicts, tuples as lists),
whatever devices wrote them.

A :class:`~jaxsampler.Sampler` saves itself with ``sampler.save(path)`` (see
:meth:`jaxsampler.Sampler.save` for what it saves and what it does not). Not
supported: samplers of host-stepped envs (``HostSampler``), and samplers or states on a
mesh spanning processes (``save`` here is written by one process; each process of such
a mesh would have to write its own shards, which orbax can do but this module does not
coordinate).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import pickle
import shutil
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

__all__ = [
    "FORMAT_VERSION",
    "CheckpointError",
    "Checkpoints",
    "dump_host",
    "fingerprint_mismatch",
    "load_host",
    "read_meta",
    "restore",
    "restore_extra",
    "save",
]

#: bumped when the layout of what samplers write changes incompatibly
FORMAT_VERSION = 1

_ARRAYS, _META, _EXTRA = "arrays", "meta", "extra"
#: orbax writes a checkpoint ``<name>`` into ``<name>.orbax-checkpoint-tmp...``, then renames it
_TMP_SUFFIX = ".orbax-checkpoint-tmp"


class CheckpointError(ValueError):
    """A checkpoint that cannot be read, or that belongs to another configuration."""


def _ocp() -> Any:
    import orbax.checkpoint as ocp  # heavy: imported on first use

    return ocp


def _checkpointer() -> Any:
    ocp = _ocp()
    return ocp.Checkpointer(
        ocp.CompositeCheckpointHandler(
            **{
                _ARRAYS: ocp.StandardCheckpointHandler(),
                _EXTRA: ocp.StandardCheckpointHandler(),
                _META: ocp.JsonCheckpointHandler(),
            }
        )
    )


def _floating(x: Any) -> bool:
    """A leaf that restores onto no particular device (an uncommitted ``jax.Array``, as
    fresh arrays are, or a ``jax.ShapeDtypeStruct`` without a sharding)."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return x.sharding is None
    return isinstance(x, jax.Array) and not x.committed


def _abstract(like: Any) -> Any:
    """``like`` as what orbax restores onto: abstract arrays with their shardings for
    placed ``jax.Array`` leaves, numpy buffers for numpy leaves and floating leaves
    (:func:`_floating`; :func:`_place` puts those on the default device afterwards, still
    uncommitted, so they mix with arrays on any device as the originals did)."""

    def leaf(x: Any) -> Any:
        if _floating(x):
            return np.empty(x.shape, x.dtype)
        if isinstance(x, jax.ShapeDtypeStruct):
            return x
        if isinstance(x, jax.Array):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
        x = np.asarray(x)
        return np.empty(x.shape, x.dtype)  # numpy leaves come back as numpy

    return jax.tree.map(leaf, like)


def _place(tree: Any, like: Any) -> Any:
    """Restored ``tree`` with the floating leaves of ``like`` as uncommitted jax arrays."""
    return jax.tree.map(lambda x, ref: jax.device_put(x) if _floating(ref) else x, tree, like)


def save(
    path: str | os.PathLike[str],
    tree: Any = None,
    *,
    extra: Mapping[str, Any] | None = None,
    meta: Mapping[str, Any] | None = None,
    host: bytes | None = None,
    overwrite: bool = False,
) -> Path:
    """Writes a checkpoint directory at ``path`` (atomically: see the module docstring).

    Args:
        path: the checkpoint's directory (its parent is created if missing).
        tree: a pytree of ``jax.Array`` / numpy leaves.
        extra: more named pytrees (e.g. a learner's params and optimizer state next to a
            sampler's state), stored as a second item that :func:`restore_extra` reads
            separately.
        meta: JSON-serializable header (stored with :data:`FORMAT_VERSION`).
        host: bytes from :func:`dump_host` (stored with their SHA-256 digest).
        overwrite: replace an existing checkpoint at ``path``. The new one is written
            completely before the old one is removed, but the swap itself is two renames:
            for crash-safe periodic saves use :class:`Checkpoints`.

    Returns:
        the checkpoint's path.

    Raises:
        FileExistsError: ``path`` exists and ``overwrite`` is False.
        TypeError: ``meta`` is not JSON-serializable.
    """
    path = Path(path).absolute()
    if path.exists() and not overwrite:
        raise FileExistsError(f"checkpoint {path} exists; pass overwrite=True to replace it")
    header = {**dict(meta or {}), "format_version": FORMAT_VERSION}  # ours wins
    main: dict[str, Any] = {"tree": tree}
    if host is not None:
        header["host_sha256"] = hashlib.sha256(host).hexdigest()
        header["host_bytes"] = len(host)
        main["host"] = np.frombuffer(host, np.uint8)
    header["extra_keys"] = sorted(extra) if extra else []
    try:
        json.dumps(header)
    except TypeError as e:
        raise TypeError(f"checkpoint meta must be JSON-serializable: {e}") from None
    ocp = _ocp()
    items = {_ARRAYS: ocp.args.StandardSave(main), _META: ocp.args.JsonSave(header)}
    if extra:
        items[_EXTRA] = ocp.args.StandardSave(dict(extra))
    path.parent.mkdir(parents=True, exist_ok=True)
    target = path if not path.exists() else path.with_name(path.name + ".new")
    if target.exists():
        shutil.rmtree(target)
    with _quiet_orbax():
        _checkpointer().save(target, ocp.args.Composite(**items))
    if target != path:  # overwrite: the new checkpoint is complete; swap it in
        old = path.with_name(path.name + ".old")
        if old.exists():
            shutil.rmtree(old)
        os.replace(path, old)
        os.replace(target, path)
        shutil.rmtree(old)
    return path


def read_meta(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON header of the checkpoint at ``path``.

    Raises:
        CheckpointError: no checkpoint there, an unfinished write, an unreadable header,
            or a format version this jaxsampler does not read.
    """
    path = Path(path).absolute()
    if not path.is_dir():
        raise CheckpointError(f"no checkpoint at {path}")
    file = path / _META / "metadata"
    try:
        header = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(
            f"checkpoint {path} is incomplete or corrupt (its header {file} cannot be read: {e})"
        ) from None
    if not isinstance(header, dict) or header.get("format_version") != FORMAT_VERSION:
        got = header.get("format_version") if isinstance(header, dict) else header
        raise CheckpointError(
            f"checkpoint {path} has format version {got!r}; this jaxsampler reads version "
            f"{FORMAT_VERSION}"
        )
    return header


def restore(path: str | os.PathLike[str], like: Any = None, *, with_host: bool = False) -> Any:
    """Reads the tree of the checkpoint at ``path`` (and its host bytes).

    Args:
        path: a checkpoint directory written by :func:`save`.
        like: a pytree with the saved tree's structure (values or
            ``jax.ShapeDtypeStruct`` leaves): the result has its structure, dtypes and
            shardings (uncommitted leaves come back uncommitted: see the module
            docstring). ``None``: the saved structure with numpy leaves (dataclasses and
            named tuples come back as dicts, tuples as lists).
        with_host: also return the host bytes (``None`` if none were saved), checked
            against their digest.

    Returns:
        the tree, or ``(tree, host_bytes)`` with ``with_host``.

    Raises:
        CheckpointError: missing, incomplete or corrupt checkpoint; ``like`` does not
            match what was saved (the message names the first differing leaf).
    """
    path = Path(path).absolute()
    header = read_meta(path)
    has_host = "host_sha256" in header
    target = None
    if like is not None:
        target = {"tree": _abstract(like)}
        if has_host:
            target["host"] = np.empty((int(header["host_bytes"]),), np.uint8)
    out = _restore_item(path, _ARRAYS, target)
    tree = out["tree"] if like is None else _place(out["tree"], like)
    if not with_host:
        return tree
    if not has_host:
        return tree, None
    blob = np.asarray(out["host"], np.uint8).tobytes()
    if hashlib.sha256(blob).hexdigest() != header["host_sha256"]:
        raise CheckpointError(f"checkpoint {path}: its host state fails its SHA-256 check")
    return tree, blob


def restore_extra(path: str | os.PathLike[str], like: Mapping[str, Any] | None = None) -> dict:
    """Reads the ``extra`` trees of the checkpoint at ``path`` (``{}`` if none were saved).

    Args:
        path: a checkpoint directory written by :func:`save`.
        like: name -> pytree for *every* saved extra (the results take their structure,
            dtypes and shardings); ``None``: numpy leaves in the saved structure.

    Raises:
        CheckpointError: a damaged checkpoint; ``like`` names other extras than were
            saved, or a tree that does not match.
    """
    path = Path(path).absolute()
    keys = read_meta(path).get("extra_keys", [])
    if like is not None and sorted(like) != keys:
        raise CheckpointError(
            f"checkpoint {path} holds extras {keys}; asked for {sorted(like)} (give all or none)"
        )
    if not keys:
        return {}
    if like is None:
        return dict(_restore_item(path, _EXTRA, None))
    out = _restore_item(path, _EXTRA, {k: _abstract(v) for k, v in like.items()})
    return {k: _place(out[k], v) for k, v in like.items()}


def _restore_item(path: Path, name: str, target: Any) -> Any:
    ocp = _ocp()
    if target is None:
        target = _numpy_target(path, name)
    else:
        _check_structure(path, name, target)
    try:
        with _quiet_orbax():
            out = _checkpointer().restore(
                path, ocp.args.Composite(**{name: ocp.args.StandardRestore(target)})
            )
        return out[name]
    except CheckpointError:
        raise
    except Exception as e:  # orbax / tensorstore raise many types for damaged files
        raise CheckpointError(
            f"checkpoint {path} cannot be read (incomplete or corrupt): {type(e).__name__}: "
            f"{_first_line(e)}"
        ) from e


def _saved_metadata(path: Path, name: str) -> Any:
    """Orbax's metadata tree of item ``name`` (shapes and dtypes per leaf)."""
    try:
        with _quiet_orbax():
            saved = _checkpointer().metadata(path).item_metadata[name]
    except Exception as e:
        raise CheckpointError(
            f"checkpoint {path} cannot be read (incomplete or corrupt): {type(e).__name__}: "
            f"{_first_line(e)}"
        ) from e
    if saved is None:
        raise CheckpointError(f"checkpoint {path} has no {name} tree")
    return _plain(saved)


def _numpy_target(path: Path, name: str) -> Any:
    """A restore target of numpy leaves in the saved structure (``like=None``): leaves come
    back as numpy arrays on the host, whatever devices wrote them."""

    def leaf(m: Any) -> Any:
        if m is None:
            return None
        return np.empty(tuple(m.shape), np.dtype(m.dtype))

    return jax.tree.map(leaf, _saved_metadata(path, name), is_leaf=lambda x: x is None)


@contextlib.contextmanager
def _quiet_orbax() -> Iterator[None]:
    """Silences orbax's and absl's informational and warning log lines for one call (a
    restore logs several per item); errors still propagate as exceptions."""
    import logging

    loggers = [logging.getLogger(n) for n in ("absl", "orbax", "jax._src.array")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else ""


def _check_structure(path: Path, name: str, target: Any) -> None:
    """Compares ``target`` with the saved item's metadata (paths, shapes, dtypes)."""
    saved = _saved_metadata(path, name)
    want = {_path_str(k): v for k, v in jax.tree_util.tree_leaves_with_path(target)}
    have = {_path_str(k): v for k, v in jax.tree_util.tree_leaves_with_path(saved) if v is not None}
    missing = sorted(_shown(k) for k in set(want) - set(have))
    extra = sorted(_shown(k) for k in set(have) - set(want))
    if missing or extra:
        raise CheckpointError(
            f"checkpoint {path} holds a different state tree: "
            + "; ".join(
                s
                for s in (
                    f"missing in the checkpoint: {', '.join(missing[:5])}" if missing else "",
                    f"not expected: {', '.join(extra[:5])}" if extra else "",
                )
                if s
            )
        )
    for k, w in want.items():
        h = have[k]
        hs, hd = tuple(getattr(h, "shape", ())), getattr(h, "dtype", None)
        if hs != tuple(w.shape) or (hd is not None and np.dtype(hd) != np.dtype(w.dtype)):
            raise CheckpointError(
                f"checkpoint {path}: leaf {_shown(k)} was saved as {np.dtype(hd) if hd else '?'}"
                f"{list(hs)}; this state expects {np.dtype(w.dtype)}{list(w.shape)}"
            )


def _shown(key: str) -> str:
    """A leaf path as the caller wrote it (without the wrapper of the saved array item)."""
    return key.removeprefix("tree/")


def _path_str(path: tuple[Any, ...]) -> str:
    """A leaf's path as ``a/b/0`` (dict keys, dataclass fields and sequence indices alike:
    orbax's metadata holds dataclasses as dicts)."""
    parts = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    return "/".join(parts)


def _plain(tree: Any) -> Any:
    """Orbax's metadata tree as nested dicts / lists (its containers vary by version)."""
    if isinstance(tree, Mapping):
        return {k: _plain(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [_plain(v) for v in tree]
    return tree


def fingerprint_mismatch(saved: Mapping[str, Any], live: Mapping[str, Any]) -> str | None:
    """A sentence naming every field where two configuration fingerprints differ
    (``None``: they agree). Fields missing on one side count as differing."""
    diffs = [
        f"{k}: checkpoint {saved.get(k)!r}, this one {live.get(k)!r}"
        for k in sorted(set(saved) | set(live))
        if saved.get(k) != live.get(k)
    ]
    return "; ".join(diffs) if diffs else None


# ----------------------------------------------------------------------------- host blob

_SAFE_BUILTINS = frozenset(
    {"set", "frozenset", "slice", "range", "complex", "bytearray", "bytes", "list", "dict"}
    | {"int", "float", "bool", "str", "tuple"}
)
#: numpy's array / scalar / dtype rebuilders (``np.ndarray`` itself, never a subclass such as
#: ``np.memmap``, whose constructor opens files)
_NUMPY_FUNCS = frozenset({"_reconstruct", "_frombuffer", "scalar"})
#: jaxsampler modules whose classes are plain data (any class defined there may be rebuilt)
_DATA_MODULES = ("jaxsampler.episodes", "jaxsampler.spaces", "jaxsampler.types")
#: further jaxsampler classes that host state holds
_DATA_CLASSES = frozenset(
    {
        ("jaxsampler.sampling.metrics", "SamplerMetrics"),
        ("jaxsampler.sampling.callbacks", "SamplerTotals"),
        ("jaxsampler.sampling.device.agent_steps", "AgentCarry"),
        ("jaxsampler.sampling.device.columns", "Columns"),
    }
)

#: Where those classes lived before the sampling package was split into its members:
#: checkpoints written then name the old places.
_MOVED_CLASSES = {
    ("jaxsampler.sampling.base", "SamplerMetrics"): (
        "jaxsampler.sampling.metrics",
        "SamplerMetrics",
    ),
    ("jaxsampler.sampling.agent_steps", "AgentCarry"): (
        "jaxsampler.sampling.device.agent_steps",
        "AgentCarry",
    ),
    ("jaxsampler.sampling.columns", "Columns"): ("jaxsampler.sampling.device.columns", "Columns"),
}


def _in_data_module(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in _DATA_MODULES)


def _safe_numpy(obj: Any, name: str) -> bool:
    if name in _NUMPY_FUNCS and callable(obj) and not isinstance(obj, type):
        return True
    if not isinstance(obj, type):
        return False
    return obj is np.ndarray or issubclass(obj, (np.generic, np.dtype))


def _host_ref(name: str) -> Any:
    """Stands for a live object in pickled host state: :class:`_Unpickler` resolves
    ``_host_ref(name)`` to the restoring side's object ``name`` (never called itself)."""
    raise CheckpointError(f"host state refers to {name!r}; load it with load_host(blob, refs)")


class _Pickler(pickle.Pickler):
    """Pickles the live objects named in ``refs`` as ``_host_ref(name)``.

    ``reducer_override`` (unlike ``persistent_id``) is not called for builtin atomic and
    container objects, which are most of an episode's objects: this keeps saves fast."""

    def __init__(self, file: io.BytesIO, refs: Mapping[int, str]):
        super().__init__(file, protocol=5)
        self._refs = refs

    def reducer_override(self, obj: Any) -> Any:
        name = self._refs.get(id(obj))
        if name is None:
            return NotImplemented
        return (_host_ref, (name,))


class _Unpickler(pickle.Unpickler):
    """Rebuilds only data: numpy arrays, scalars and dtypes, builtin containers,
    jaxsampler's data classes (episodes, spaces, the samplers' carried columns and
    counters) and the live objects named by reference. Anything else (a function, a
    class of another package, a jaxsampler class with side effects such as a server) is
    refused before it is called, so loading a checkpoint cannot run code."""

    def __init__(self, file: io.BytesIO, refs: Mapping[str, Any]):
        super().__init__(file)
        self._refs = refs

    def _resolve(self, pid: Any) -> Any:
        if not isinstance(pid, str) or pid not in self._refs:
            raise CheckpointError(f"host state refers to {pid!r}, which this sampler lacks")
        return self._refs[pid]

    def find_class(self, module: str, name: str) -> Any:
        if module == __name__ and name == "_host_ref":
            return self._resolve
        top = module.split(".")[0]
        module, name = _MOVED_CLASSES.get((module, name), (module, name))
        if module == "builtins" and name in _SAFE_BUILTINS:
            return super().find_class(module, name)
        if module == "collections" and name in ("OrderedDict", "defaultdict", "deque"):
            return super().find_class(module, name)
        if top == "numpy":
            obj = super().find_class(module, name)
            if _safe_numpy(obj, name):
                return obj
        if (module, name) in _DATA_CLASSES or _in_data_module(module):
            obj = super().find_class(module, name)
            if isinstance(obj, type) and (
                (obj.__module__, obj.__qualname__) in _DATA_CLASSES
                or _in_data_module(obj.__module__)
            ):
                return obj
        raise CheckpointError(
            f"host state holds {module}.{name}, which a checkpoint may not (only numpy "
            "arrays, builtin containers and jaxsampler's data classes are rebuilt on load)"
        )


def dump_host(obj: Any, refs: Mapping[str, Any] | None = None) -> bytes:
    """Pickles host-side state. Objects in ``refs`` (name -> live object: spaces, id
    generators, anything the restoring side rebuilds from its own configuration) are
    written as references to their names, not as data."""
    buf = io.BytesIO()
    by_id = {id(v): k for k, v in (refs or {}).items()}
    _Pickler(buf, by_id).dump(obj)
    return buf.getvalue()


def load_host(blob: bytes, refs: Mapping[str, Any] | None = None) -> Any:
    """Unpickles :func:`dump_host`'s bytes with a restricted loader (see
    :class:`_Unpickler`); references resolve to ``refs``' live objects.

    Raises:
        CheckpointError: the bytes are not such state, or hold a disallowed object.
    """
    try:
        return _Unpickler(io.BytesIO(blob), refs or {}).load()
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(f"host state cannot be read: {type(e).__name__}: {e}") from None


# ----------------------------------------------------------------------------- directories


class Checkpoints:
    """A directory of numbered checkpoints (``<directory>/<step>``), the newest kept:
    orbax's ``CheckpointManager`` semantics (atomic writes; an unfinished write is never
    listed, so after a crash :attr:`latest_step` is the last complete one).

    Args:
        directory: where the numbered checkpoints live (created if missing).
        max_to_keep: older checkpoints beyond this many are deleted after each save
            (``None``: keep all).

    Example::

        ckpts = js.rollout.checkpoint.Checkpoints("runs/ppo", max_to_keep=2)
        step = ckpts.latest_step()
        if step is not None:
            params = sampler.load(ckpts.path(step), params=params)["params"]
        ...
        ckpts.save(step, lambda p: sampler.save(p, params=params))
    """

    def __init__(self, directory: str | os.PathLike[str], max_to_keep: int | None = 3):
        if max_to_keep is not None and (
            isinstance(max_to_keep, bool) or not isinstance(max_to_keep, int) or max_to_keep < 1
        ):
            raise ValueError(f"max_to_keep must be an int >= 1 or None, got {max_to_keep!r}")
        self.directory = Path(directory).absolute()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_to_keep = max_to_keep

    def steps(self) -> list[int]:
        """The complete checkpoints' steps, ascending (unfinished writes, which live in
        orbax's temporary directories until they are complete, are skipped)."""
        out = []
        for p in self.directory.iterdir():
            if p.is_dir() and p.name.isdigit() and (p / _META / "metadata").is_file():
                out.append(int(p.name))
        return sorted(out)

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step (``None``: none yet)."""
        steps = self.steps()
        return steps[-1] if steps else None

    def path(self, step: int) -> Path:
        """The directory of checkpoint ``step``."""
        return self.directory / str(int(step))

    def save(self, step: int, write: Callable[[Path], Any]) -> Path:
        """Writes checkpoint ``step`` with ``write(path)`` (e.g.
        ``lambda p: sampler.save(p, params=params)`` or
        ``lambda p: js.rollout.checkpoint.save(p, tree)``), then deletes the oldest beyond
        :attr:`max_to_keep`. Returns its path. The temporary directory of an earlier,
        killed write of the same step is removed first.

        Raises:
            FileExistsError: checkpoint ``step`` exists.
        """
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"step must be an int >= 0, got {step!r}")
        path = self.path(step)
        # an earlier writer of this step that died mid-save left its temporary directory
        for stale in self.directory.glob(f"{int(step)}{_TMP_SUFFIX}*"):
            shutil.rmtree(stale, ignore_errors=True)
        write(path)
        if self.max_to_keep is not None:
            for old in self.steps()[: -self.max_to_keep]:
                shutil.rmtree(self.path(old), ignore_errors=True)
        return path
