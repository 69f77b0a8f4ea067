"""Videos of a policy: rendered episodes in one jitted call, written as MP4 or GIF.

::

    frames = js.integrations.record_video(
        "CartPole-v1", policy, params, "cartpole.mp4", num_episodes=2
    )
    video.to_html(frames, fps=30)                 # inline in a notebook

:func:`rollout_frames` is the pure part: ``N`` episodes stepped side by side (``vmap``)
inside one jitted ``lax.while_loop``, each env's state rendered at every step with
``jax.vmap(env.render)``, first and final state included. The loop runs until every
episode has ended (or for ``max_steps`` steps); an env whose episode ended keeps its
final state and its later frames are zeros (black), so the output has one fixed shape.

:func:`record_video` adds the host side: it validates the output path (suffix, directory,
writability), the env's ``can_render`` and the optional dependency *before* any tracing
or sampling, runs :func:`rollout_frames`, concatenates the episodes and writes the file
(``.mp4`` through imageio-ffmpeg, ``.gif`` through imageio's pillow plugin). The file
writers need the ``video`` extra: ``pip install -e ".[video]"``.

Keys, as in :func:`jaxsampler.evaluate`: with ``k_reset, k_step, k_policy, _ =
jax.random.split(key, 4)``, episode ``i`` is reset with ``fold_in(k_reset, i)``, its step
``t`` uses ``fold_in(fold_in(k_step, i), t)`` and the policy's key at step ``t`` is
``fold_in(k_policy, t)``. So the episodes of a video are those of
``js.evaluate(env, policy, params, N, key)`` (same key, ``N`` envs, no refill), and a
video shows what the evaluation measured.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxsampler import vector
from jaxsampler.envs.base import Env
from jaxsampler.envs.registry import make_jax_env
from jaxsampler.policies.base import Policy
from jaxsampler.policies.greedy import greedy
from jaxsampler.rollout import Transforms, check_action, check_compatible
from jaxsampler.rollout.evaluation import (
    _check_count,
    _default_max_steps,
    _frozen_transform_state,
    _observe_first,
    _per_env_fold,
    _select_rows,
    _shared_of,
)
from jaxsampler.transforms.base import Context, Pipeline, TransformState
from jaxsampler.types import RolloutState

__all__ = [
    "InlineMedia",
    "SUFFIXES",
    "check_output_path",
    "frames_of_episodes",
    "record_video",
    "rollout_frames",
    "save_frame",
    "to_html",
]

#: Video file suffixes :func:`record_video` writes, and what writes them.
SUFFIXES = {".mp4": "imageio-ffmpeg", ".gif": "imageio (pillow)"}

_INSTALL = 'pip install -e ".[video]"'


# --------------------------------------------------------------------------- checks


def _as_env(env: Env | str) -> Env:
    if isinstance(env, str):
        return make_jax_env(env)
    return env


def can_render(env: Any) -> bool:
    """Whether ``env`` renders frames (its ``can_render`` flag; False when it has none)."""
    return bool(getattr(env, "can_render", False))


def _check_renders(env: Any, where: str) -> None:
    if not can_render(env):
        name = getattr(env, "name", type(env).__name__)
        raise TypeError(
            f"{where}: env {name} cannot render (env.can_render is False): frames need an env "
            "with a render(state, params) method; the built-in classic-control envs, and "
            "gymnax's MinAtar and classic-control envs through js.envs.from_gymnax, have one"
        )


def _require_imageio(suffix: str) -> Any:
    """Imports imageio (and, for ``.mp4``, imageio-ffmpeg); raises ``ImportError`` with the
    install command when missing."""
    try:
        import imageio
    except ImportError as e:
        raise ImportError(
            f"writing {suffix or 'image'} files needs imageio: {_INSTALL} "
            "(or pip install imageio imageio-ffmpeg)"
        ) from e
    if suffix == ".mp4":
        try:
            import imageio_ffmpeg  # noqa: F401
        except ImportError as e:
            raise ImportError(
                f"writing .mp4 files needs imageio-ffmpeg: {_INSTALL} "
                "(or pip install imageio-ffmpeg); .gif needs only imageio"
            ) from e
    return imageio


def check_output_path(path: str | os.PathLike[str], suffixes: Any = SUFFIXES) -> Path:
    """Validates an output file path before any work is done; returns it as a ``Path``.

    Checks that the suffix is one of ``suffixes`` (case-insensitive), that the directory
    exists and is a directory, that ``path`` is not itself a directory, and that a file
    can be created there (by creating and removing a probe file, which also catches
    read-only file systems and permissions that ``os.access`` misjudges).

    Raises:
        ValueError: unsupported suffix (naming the supported ones).
        OSError: ``FileNotFoundError``, ``NotADirectoryError``, ``IsADirectoryError`` or
            ``PermissionError``: the directory is missing, not a directory, the path is a
            directory, or the directory is not writable; the message names the path.
    """
    p = Path(os.fspath(path)).expanduser()
    suffix = p.suffix.lower()
    if suffix not in suffixes:
        raise ValueError(
            f"unsupported file type {p.suffix or '(no suffix)'!r} for {str(p)!r}: "
            f"use one of {', '.join(sorted(suffixes))}"
        )
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.exists():
        raise FileNotFoundError(
            f"cannot write {str(p)!r}: directory {str(parent)!r} does not exist"
        )
    if not parent.is_dir():
        raise NotADirectoryError(f"cannot write {str(p)!r}: {str(parent)!r} is not a directory")
    if p.is_dir():
        raise IsADirectoryError(f"cannot write {str(p)!r}: it is a directory")
    if p.exists() and not os.access(p, os.W_OK):
        raise PermissionError(f"cannot write {str(p)!r}: the file is not writable")
    try:
        fd, probe = tempfile.mkstemp(prefix=".jaxsampler-probe-", dir=parent)
    except OSError as e:
        raise PermissionError(
            f"cannot write {str(p)!r}: directory {str(parent)!r} is not writable ({e.strerror})"
        ) from e
    os.close(fd)
    os.unlink(probe)
    return p


# --------------------------------------------------------------------------- frames


def _render_batch(env: Env, states: Any, params: Any) -> jax.Array:
    """``uint8[E, H, W, 3]`` frames of ``E`` states (params shared or per env)."""
    axes = vector.param_axes(env, params, jax.tree.leaves(states)[0].shape[0])
    return jax.vmap(env.render, in_axes=(0, axes))(states, params)


def _frames_impl(
    params: Any,
    env_params: Any,
    shared: Any,
    keys: jax.Array,
    *,
    env: Env,
    policy: Policy,
    pipe: Pipeline,
    num_episodes: int,
    max_steps: int,
) -> tuple[jax.Array, jax.Array]:
    """The jitted body of :func:`rollout_frames` (see there)."""
    N, A, T = num_episodes, env.num_agents, max_steps
    ctx = Context(frozen=True)
    k_reset, k_step, k_pol, k_params = (keys[i] for i in range(4))
    episode = jnp.arange(N, dtype=jnp.int32)
    tstate = _frozen_transform_state(pipe, (N, A), shared)
    if pipe.randomizes_params:
        assert tstate is not None
        tstate, env_params = pipe.reset_params(
            tstate,
            jax.random.fold_in(k_params, 0),
            jnp.ones((N,), jnp.bool_),
            vector.broadcast_params(env, env_params, N),
            ctx,
        )
    env_state, ts = vector.reset(env, _per_env_fold(k_reset, episode), env_params)
    tstate, obs = _observe_first(pipe, tstate, ts, (N, A), ctx)
    first = _render_batch(env, env_state, env_params)
    if first.dtype != jnp.uint8 or first.ndim != 4 or first.shape[-1] != 3:
        raise TypeError(
            f"{env.name}.render must return uint8[H, W, 3], got "
            f"{first.dtype}{list(first.shape[1:])}"
        )
    frames = jnp.zeros((N, T + 1) + first.shape[1:], jnp.uint8).at[:, 0].set(first)
    step_keys0 = _per_env_fold(k_step, episode)

    def cond(c: tuple[Any, ...]) -> jax.Array:
        t, done = c[0], c[5]
        return (t < T) & ~jnp.all(done)

    def body(c: tuple[Any, ...]) -> tuple[Any, ...]:
        t, env_state, obs, pstate, tstate, done, agent_done, lengths, frames = c
        action, _, pstate = policy(params, obs, jax.random.fold_in(k_pol, t), pstate)
        check_action(pipe.action_space, action, (N, A))
        env_action = pipe.to_env(action) if pipe.changes_action else action
        check_action(env.action_space, env_action, (N, A))
        step_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(step_keys0, t)
        new_state, ts = vector.step(env, step_keys, env_state, env_action, env_params)
        new_obs = ts.obs
        if pipe:
            new_tstate, seen = pipe.observe_timestep(
                tstate, ts, jnp.zeros((N,), jnp.bool_), action, ctx
            )
            new_obs = seen.obs
            tstate = _select_rows(done, tstate, new_tstate)
        live = ~done
        agent_done = agent_done | (live[:, None] & (ts.terminated | ts.truncated))
        lengths = lengths + live.astype(jnp.int32)
        frame = _render_batch(env, new_state, env_params)
        frame = jnp.where(live[:, None, None, None], frame, jnp.zeros_like(frame))
        return (
            t + 1,
            # An ended episode keeps its final state: stepping on is undefined.
            vector.select_envs(done, env_state, new_state),
            vector.select_envs(done, obs, new_obs),
            vector.select_envs(done, c[3], pstate),
            tstate,
            done | jnp.all(agent_done, axis=-1),
            agent_done,
            lengths,
            frames.at[:, t + 1].set(frame),
        )

    carry = (
        jnp.zeros((), jnp.int32),
        env_state,
        obs,
        policy.initial_state((N, A)),
        tstate,
        jnp.zeros((N,), jnp.bool_),
        jnp.zeros((N, A), jnp.bool_),
        jnp.zeros((N,), jnp.int32),
        frames,
    )
    out = jax.lax.while_loop(cond, body, carry)
    return out[8], out[7]


_frames = jax.jit(
    _frames_impl, static_argnames=("env", "policy", "pipe", "num_episodes", "max_steps")
)


def rollout_frames(
    env: Env | str,
    policy: Policy,
    params: Any,
    key: jax.Array,
    num_episodes: int = 1,
    *,
    env_params: Any = None,
    max_steps: int | None = None,
    explore: bool = False,
    transforms: Transforms = None,
    transform_state: TransformState | RolloutState | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Renders ``num_episodes`` episodes of ``policy`` in ``env``, in one jitted call.

    The ``N`` episodes run side by side (one env each, ``vmap``); every env's state is
    rendered with ``jax.vmap(env.render)`` after the reset and after each step, inside
    the same ``lax.while_loop``. The loop stops when every episode has ended
    (terminated or truncated, for every agent) or after ``max_steps`` steps. A
    multi-agent env gives one frame of the whole world per env step.

    Args:
        env: a renderable env (``env.can_render``) or an env id (``js.make``).
        policy: the policy, built for the env's spaces (after ``transforms``).
        params: the policy's params.
        key: a PRNG key (see the module docstring for how episodes draw theirs).
        num_episodes: ``N``, the number of episodes.
        env_params: ``env.default_params`` by default; shared by every episode, or per
            episode (leaves with a leading ``[N]`` axis).
        max_steps: ``T``, the step bound (static: it sets the output shape); by default
            the params' ``max_steps_in_episode`` (else 10 000; pass a bound for envs
            without a time limit). Episodes still running then are cut.
        explore: ``False``: act greedily (:func:`jaxsampler.greedy`); ``True``: act as
            the policy is configured (sampling, for a policy with ``explore=True``).
        transforms: the transforms the policy was trained with (run with frozen
            statistics, as in :func:`jaxsampler.evaluate`).
        transform_state: the training ``RolloutState`` (or its ``transform_state``),
            whose shared statistics (e.g. observation normalization) the policy needs.

    Returns:
        ``(frames, lengths)``: ``frames`` ``uint8[N, T + 1, H, W, 3]``, ``lengths``
        ``int32[N]``, the steps of each episode. Episode ``i``'s frames are
        ``frames[i, :lengths[i] + 1]`` (its first state, then one frame per step, the
        final state included); later frames are zeros. jax arrays (on device).

    Raises:
        TypeError: the env cannot render (naming it); ``explore=False`` with a policy
            that cannot act greedily (pass ``explore=True``).
        ValueError: bad ``num_episodes`` / ``max_steps``; a policy that does not fit the
            env; params of the wrong shapes.
    """
    env = _as_env(env)
    _check_renders(env, "rollout_frames")
    N = _check_count(num_episodes, "num_episodes")
    if isinstance(key, (int, np.integer)):
        raise TypeError(
            f"rollout_frames: key must be a PRNG key (jax.random.key(seed) or "
            f"jax.random.PRNGKey(seed)), got the int {key!r}"
        )
    pipe = check_compatible(env, policy, transforms)
    if not explore:
        try:
            policy = greedy(policy)
        except TypeError as e:
            raise TypeError(f"explore=False acts greedily, but {e}; or pass explore=True") from e
    shared = _shared_of(pipe, transform_state)
    env_params = env.default_params if env_params is None else env_params
    try:
        vector.param_axes(env, env_params, N)
    except ValueError as e:
        raise ValueError(f"rollout_frames: {e} (one env per episode)") from None
    T = _default_max_steps(env_params) - 1 if max_steps is None else max_steps
    T = _check_count(T, "max_steps")
    env_params = jax.tree.map(jnp.asarray, env_params)
    return _frames(
        params,
        env_params,
        shared,
        jax.random.split(key, 4),
        env=env,
        policy=policy,
        pipe=pipe,
        num_episodes=N,
        max_steps=T,
    )


def frames_of_episodes(frames: Any, lengths: Any) -> np.ndarray:
    """The valid frames of :func:`rollout_frames`' output, episodes one after another:
    ``uint8[sum(lengths + 1), H, W, 3]`` (numpy)."""
    frames, lengths = np.asarray(frames), np.asarray(lengths)
    return np.concatenate([frames[i, : int(n) + 1] for i, n in enumerate(lengths)], axis=0)


# --------------------------------------------------------------------------- files


def _even(frames: np.ndarray) -> np.ndarray:
    """Frames padded (edge rows/columns repeated) to even height and width, as H.264's
    yuv420p needs."""
    h, w = frames.shape[1:3]
    if h % 2 == 0 and w % 2 == 0:
        return frames
    return np.pad(frames, ((0, 0), (0, h % 2), (0, w % 2), (0, 0)), mode="edge")


def _write(path: Path, frames: np.ndarray, fps: float) -> None:
    """Writes ``uint8[T, H, W, 3]`` frames to ``path`` (``.mp4`` or ``.gif``)."""
    suffix = path.suffix.lower()
    imageio = _require_imageio(suffix)
    if suffix == ".mp4":
        import imageio.v2 as iio2

        with warnings.catch_warnings():
            # ffmpeg runs as a subprocess; JAX warns about every fork, harmlessly here (the
            # child execs ffmpeg at once and runs no JAX code).
            warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called")
            _write_mp4(iio2, path, frames, fps)
    else:
        # Pillow's GIF timing is in milliseconds; loop=0 repeats forever.
        imageio.v3.imwrite(str(path), frames, extension=".gif", duration=1000.0 / fps, loop=0)


def _write_mp4(iio2: Any, path: Path, frames: np.ndarray, fps: float) -> None:
    writer = iio2.get_writer(
        str(path),
        format="FFMPEG",
        mode="I",
        fps=fps,
        codec="libx264",
        pixelformat="yuv420p",
        macro_block_size=2,
        ffmpeg_log_level="error",
    )
    try:
        for frame in _even(frames):
            writer.append_data(frame)
    finally:
        writer.close()


def save_frame(path: str | os.PathLike[str], frame: Any) -> Path:
    """Writes one ``uint8[H, W, 3]`` frame as an image (``.png``, ``.jpg``, ``.gif``) with
    imageio. Raises ``ImportError`` naming ``pip install -e ".[video]"`` without it, and
    :func:`check_output_path`'s errors."""
    p = check_output_path(path, {".png", ".jpg", ".jpeg", ".gif", ".bmp"})
    imageio = _require_imageio(p.suffix.lower())
    imageio.v3.imwrite(str(p), np.asarray(frame, np.uint8))
    return p


def record_video(
    env: Env | str,
    policy: Policy,
    params: Any,
    path: str | os.PathLike[str] | None,
    num_episodes: int = 1,
    *,
    seed: int = 0,
    fps: float = 30,
    env_params: Any = None,
    max_steps: int | None = None,
    explore: bool = False,
    transforms: Transforms = None,
    transform_state: TransformState | RolloutState | None = None,
) -> np.ndarray:
    """Renders ``num_episodes`` episodes of ``policy`` and writes them as a video.

    Everything that can fail on the host is checked first, before anything is traced,
    compiled or sampled: the path's suffix (``.mp4`` or ``.gif``), that its directory
    exists and is writable, that the env renders, and that imageio (and imageio-ffmpeg
    for ``.mp4``) is installed. The episodes then come from one :func:`rollout_frames`
    call (``key = jax.random.PRNGKey(seed)``) and are written one after another.

    Args:
        env: a renderable env or an env id (``js.make``).
        policy, params: the policy and its params.
        path: the output file (``.mp4``: H.264 through imageio-ffmpeg; ``.gif``: through
            pillow); ``None``: write nothing, only return the frames.
        num_episodes: episodes in the video.
        seed: the PRNG seed of the episodes.
        fps: frames per second of the file.
        env_params, max_steps, explore, transforms, transform_state: as for
            :func:`rollout_frames`.

    Returns:
        The frames written, ``uint8[F, H, W, 3]`` numpy, ``F = sum(lengths + 1)``: each
        episode's first state, one frame per step, and its final state.

    Raises:
        ValueError: unsupported suffix; bad counts.
        OSError (``FileNotFoundError``, ``NotADirectoryError``, ``PermissionError``): the
            path cannot be written (naming it).
        TypeError: the env cannot render (naming it).
        ImportError: imageio / imageio-ffmpeg missing (naming ``pip install -e ".[video]"``).
    """
    out = None if path is None else check_output_path(path)
    env = _as_env(env)
    _check_renders(env, "record_video")
    if not (isinstance(fps, (int, float, np.integer, np.floating)) and fps > 0):
        raise ValueError(f"record_video: fps must be a number > 0, got {fps!r}")
    if out is not None:
        _require_imageio(out.suffix.lower())
    frames, lengths = rollout_frames(
        env,
        policy,
        params,
        jax.random.PRNGKey(seed),
        num_episodes,
        env_params=env_params,
        max_steps=max_steps,
        explore=explore,
        transforms=transforms,
        transform_state=transform_state,
    )
    video = frames_of_episodes(*jax.device_get((frames, lengths)))
    if out is not None:
        _write(out, video, float(fps))
    return video


# --------------------------------------------------------------------------- notebooks


@dataclasses.dataclass(frozen=True)
class InlineMedia:
    """An HTML snippet (``<video>`` or ``<img>`` with base64 data) that Jupyter displays
    inline (``_repr_html_``); ``str()`` gives the HTML."""

    html: str
    num_bytes: int

    def _repr_html_(self) -> str:
        return self.html

    def __str__(self) -> str:
        return self.html


_MIME = {".mp4": "video/mp4", ".gif": "image/gif", ".png": "image/png"}


def _media_html(data: bytes, mime: str, width: int | None) -> InlineMedia:
    b64 = base64.b64encode(data).decode("ascii")
    size = f' width="{int(width)}"' if width else ""
    src = html.escape(f"data:{mime};base64,{b64}", quote=True)
    if mime.startswith("video/"):
        tag = f'<video{size} controls autoplay loop muted playsinline src="{src}"></video>'
    else:
        tag = f'<img{size} src="{src}"/>'
    return InlineMedia(tag, len(data))


def to_html(
    frames_or_path: Any,
    fps: float = 30,
    *,
    format: str = "mp4",
    downscale: int = 1,
    width: int | None = None,
) -> InlineMedia:
    """Inline notebook media of a video: a file or frames, as base64 ``<video>``/``<img>``.

    Args:
        frames_or_path: ``uint8[T, H, W, 3]`` frames (e.g. :func:`record_video`'s), or the
            path of an ``.mp4`` / ``.gif`` / ``.png`` file (embedded as it is).
        fps: frames per second (frames only).
        format: ``"mp4"`` (small, H.264) or ``"gif"`` (frames only).
        downscale: keep every ``downscale``-th pixel row and column (frames only): a
            factor 2 makes the data about 4 times smaller.
        width: display width in pixels (the browser scales), or the frames' own.

    Returns:
        An :class:`InlineMedia` (display it, or put it last in a cell).

    Raises:
        ValueError: unknown ``format``, bad ``downscale``, frames of another shape;
        ImportError: imageio missing (frames only; naming ``pip install -e ".[video]"``).
    """
    if isinstance(frames_or_path, (str, os.PathLike)):
        p = Path(os.fspath(frames_or_path))
        mime = _MIME.get(p.suffix.lower())
        if mime is None:
            raise ValueError(f"to_html: unsupported file type {p.suffix!r} (.mp4, .gif, .png)")
        return _media_html(p.read_bytes(), mime, width)
    suffix = f".{format.lower()}"
    if suffix not in SUFFIXES:
        raise ValueError(f"to_html: format must be 'mp4' or 'gif', got {format!r}")
    if isinstance(downscale, bool) or not isinstance(downscale, (int, np.integer)) or downscale < 1:
        raise ValueError(f"to_html: downscale must be an int >= 1, got {downscale!r}")
    frames = np.asarray(frames_or_path)
    if frames.ndim == 3:
        frames = frames[None]
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"to_html: frames must be uint8[T, H, W, 3], got shape {frames.shape}")
    frames = np.ascontiguousarray(frames[:, ::downscale, ::downscale].astype(np.uint8))
    with tempfile.TemporaryDirectory(prefix="jaxsampler-video-") as d:
        path = Path(d) / f"video{suffix}"
        _write(path, frames, float(fps))
        return _media_html(path.read_bytes(), _MIME[suffix], width)
