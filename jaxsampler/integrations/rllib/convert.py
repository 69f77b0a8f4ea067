"""Exact conversions between jaxsampler's episodes/batches and RLlib's (ray 2.60).

:func:`to_rllib` turns a jaxsampler ``SingleAgentEpisode``, ``MultiAgentEpisode``,
``SampleBatch`` or ``MultiAgentBatch`` (or a list / tuple of them) into the RLlib object of
the same name; :func:`from_rllib` is its exact inverse. Every field survives: the columns
with their lookback lengths, ``t_started`` / ``t``, ids, the done flags, the spaces
(jaxsampler spaces become the equivalent ``gymnasium.spaces`` and back), ``custom_data``,
the step timers, and for multi-agent episodes the env-step mapping, the hanging caches, the
agent start times and the agent-to-module mapping. Round trips are identity.

The conversion shares the numpy arrays (no copy per step: episodes are built from whole
arrays): writing into a converted episode's arrays in place (``set_*``) changes the source
too. Lists (list-mode columns, infos) are copied shallowly, so appending to one side never
changes the other. Objects that already have the target type pass through unchanged, so both
functions can be applied to mixed lists.
"""

from __future__ import annotations

import contextlib
import gc
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any, cast

from jaxsampler.episodes.batch import MultiAgentBatch as JsMultiAgentBatch
from jaxsampler.episodes.batch import SampleBatch as JsSampleBatch
from jaxsampler.episodes.lookback import InfiniteLookbackBuffer as JsBuffer
from jaxsampler.episodes.multi_agent import MultiAgentEpisode as JsMultiAgentEpisode
from jaxsampler.episodes.multi_agent import default_agent_to_module_mapping_fn
from jaxsampler.episodes.single_agent import SingleAgentEpisode as JsSingleAgentEpisode
from jaxsampler.episodes.single_agent import reward_space
from jaxsampler.integrations.rllib import require_rllib
from jaxsampler.sampling.device.columns import no_gc, obs_at
from jaxsampler.sampling.device.single import EpisodeColumns

require_rllib()

import gymnasium  # noqa: E402
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig  # noqa: E402
from ray.rllib.env.multi_agent_episode import (  # noqa: E402
    MultiAgentEpisode as RlMultiAgentEpisode,
)
from ray.rllib.env.single_agent_episode import (  # noqa: E402
    SingleAgentEpisode as RlSingleAgentEpisode,
)
from ray.rllib.env.utils.infinite_lookback_buffer import (  # noqa: E402
    InfiniteLookbackBuffer as RlBuffer,
)
from ray.rllib.policy.sample_batch import MultiAgentBatch as RlMultiAgentBatch  # noqa: E402
from ray.rllib.policy.sample_batch import SampleBatch as RlSampleBatch  # noqa: E402
from ray.rllib.utils.spaces.space_utils import get_base_struct_from_space  # noqa: E402

from jaxsampler.spaces import Space, convert_space  # noqa: E402

__all__ = ["to_rllib", "from_rllib", "rllib_episodes"]

_SUPPORTED_TO = (
    "jaxsampler SingleAgentEpisode, MultiAgentEpisode, SampleBatch, MultiAgentBatch, "
    "or a list/tuple of them"
)
_SUPPORTED_FROM = (
    "RLlib SingleAgentEpisode, MultiAgentEpisode, SampleBatch, MultiAgentBatch, "
    "or a list/tuple of them"
)

# The default agent-to-module mappings (every agent -> "default_policy"), one per side.
_JS_DEFAULT_MAPPING = default_agent_to_module_mapping_fn
_RL_DEFAULT_MAPPING = AlgorithmConfig.DEFAULT_AGENT_TO_MODULE_MAPPING_FN

# RLlib's constant space of one reward (a float32 scalar Box, one object for all episodes).
_RL_REWARD_SPACE = RlSingleAgentEpisode(rewards=[]).rewards.space


_NESTED = (gymnasium.spaces.Dict, gymnasium.spaces.Tuple)


class _Spaces:
    """Space conversions for one call, memoized by object identity (the episodes of one
    ``sample()`` share their space objects, so each is converted once)."""

    __slots__ = ("_rl", "_from")

    def __init__(self) -> None:
        # id(space) -> (space, results); holding `space` keeps its id unique meanwhile
        self._rl: dict[int, tuple[Any, Any, Any]] = {}
        self._from: dict[int, tuple[Any, Any]] = {}

    def rl(self, space: Any) -> tuple[Any, Any]:
        """``(gymnasium space, RLlib's get_base_struct_from_space of it)`` for a
        jaxsampler, gymnax or gymnasium space (or ``None``)."""
        hit = self._rl.get(id(space))
        if hit is not None and hit[0] is space:
            return hit[1], hit[2]
        if space is None or isinstance(space, gymnasium.spaces.Space):
            gym_space = space
        else:
            gym_space = _js_to_gym(space)
        # RLlib's struct: a py dict/tuple of the leaf spaces, the space itself when flat
        struct = (
            get_base_struct_from_space(gym_space) if isinstance(gym_space, _NESTED) else gym_space
        )
        self._rl[id(space)] = (space, gym_space, struct)
        return gym_space, struct

    def to_gym(self, space: Any) -> Any:
        return self.rl(space)[0]

    def from_gym(self, space: Any) -> Any:
        hit = self._from.get(id(space))
        if hit is not None and hit[0] is space:
            return hit[1]
        js_space = space if space is None or isinstance(space, Space) else _gym_to_js(space)
        self._from[id(space)] = (space, js_space)
        return js_space


def _js_to_gym(space: Any) -> Any:
    if space is reward_space():
        return _RL_REWARD_SPACE
    try:
        js_space = convert_space(space)
    except TypeError as err:
        raise TypeError(
            f"to_rllib: cannot convert the space {space!r} ({type(space).__name__}) into a "
            "gymnasium space; supported: jaxsampler, gymnax and gymnasium Box, Discrete, "
            "MultiDiscrete, Dict, Tuple"
        ) from err
    return js_space.to_gymnasium()


def _gym_to_js(space: Any) -> Any:
    if space is _RL_REWARD_SPACE:
        return reward_space()
    try:
        return convert_space(space)
    except (TypeError, ValueError) as err:
        raise TypeError(
            f"from_rllib: cannot convert the space {space!r} ({type(space).__name__}) into a "
            "jaxsampler space; supported: gymnasium Box, Discrete, MultiDiscrete (start 0), "
            "Dict, Tuple"
        ) from err


# ----------------------------------------------------------------------- single agent


def _buf_to_rl(buf: JsBuffer, spaces: _Spaces) -> RlBuffer:
    """RLlib's buffer over ``buf``'s data, as ``InfiniteLookbackBuffer(data, lookback,
    space)`` builds it, minus its per-buffer recomputation of the space's struct (computed
    once per space). RLlib has no trusted constructor; the fields set here are exactly
    those its ``__init__`` sets (a test compares the two)."""
    out: Any = RlBuffer.__new__(RlBuffer)
    data = buf.data
    if type(data) is list:
        out.data, out.finalized = list(data), False
    else:
        out.data, out.finalized = data, True
    out.lookback = buf.lookback
    out._space, out._space_struct = spaces.rl(buf.space)
    return out


def _buf_from_rl(buf: RlBuffer, spaces: _Spaces) -> JsBuffer:
    data = buf.data
    return JsBuffer.trusted(
        list(data) if type(data) is list else data, buf.lookback, spaces.from_gym(buf.space)
    )


def _sa_to_rllib(ep: JsSingleAgentEpisode, spaces: _Spaces) -> RlSingleAgentEpisode:
    """RLlib's episode with ``ep``'s fields, as RLlib's constructor builds it from
    prebuilt buffers (``t = t_started + len(rewards)``), without its re-validation and
    struct recomputation (a test checks the result against the constructor's)."""
    out: Any = RlSingleAgentEpisode.__new__(RlSingleAgentEpisode)
    out.id_, out.agent_id, out.module_id, out.multi_agent_episode_id = (
        ep.id_,
        ep.agent_id,
        ep.module_id,
        ep.multi_agent_episode_id,
    )
    out.observations = _buf_to_rl(ep.observations, spaces)
    out.infos = _buf_to_rl(ep.infos, spaces)
    out.actions = _buf_to_rl(ep.actions, spaces)
    out.rewards = _buf_to_rl(ep.rewards, spaces)
    out.extra_model_outputs = {k: _buf_to_rl(v, spaces) for k, v in ep.extra_model_outputs.items()}
    out._observation_space = spaces.to_gym(ep.observation_space)
    out._action_space = spaces.to_gym(ep.action_space)
    out.is_terminated, out.is_truncated = ep.is_terminated, ep.is_truncated
    out.t_started, out.t = ep.t_started, ep.t
    out._custom_data = dict(ep.custom_data)
    out._start_time, out._last_step_time = ep.step_times
    out._last_added_observation = out._last_added_infos = None
    return out


def _sa_from_rllib(ep: RlSingleAgentEpisode, spaces: _Spaces) -> JsSingleAgentEpisode:
    return JsSingleAgentEpisode.trusted(
        ep.id_,
        observations=_buf_from_rl(ep.observations, spaces),
        infos=_buf_from_rl(ep.infos, spaces),
        actions=_buf_from_rl(ep.actions, spaces),
        rewards=_buf_from_rl(ep.rewards, spaces),
        extra_model_outputs={k: _buf_from_rl(v, spaces) for k, v in ep.extra_model_outputs.items()},
        observation_space=spaces.from_gym(ep.observation_space),
        action_space=spaces.from_gym(ep.action_space),
        terminated=ep.is_terminated,
        truncated=ep.is_truncated,
        t_started=ep.t_started,
        agent_id=ep.agent_id,
        module_id=ep.module_id,
        multi_agent_episode_id=cast(Any, ep.multi_agent_episode_id),
        t=ep.t,
        custom_data=dict(ep.custom_data),
        step_times=(ep._start_time, ep._last_step_time),
    )


def rllib_episodes(columns: EpisodeColumns) -> list[RlSingleAgentEpisode]:
    """RLlib ``SingleAgentEpisode`` objects straight from a device sampler call's columns
    (``DeviceSampler(..., episode_factory=rllib_episodes)``): field by field what
    ``to_rllib`` gives for the sampler's own episodes of the same call, without making
    those first (a test compares the two).

    Per episode only RLlib's episode, its buffers (numpy views of the call's columns), the
    extras dict and the infos list are made; the spaces are converted once per call.
    """
    spaces = _Spaces()
    obs_space, obs_struct = spaces.rl(columns.observation_space)
    act_space, act_struct = spaces.rl(columns.action_space)
    rew_space, rew_struct = spaces.rl(reward_space())
    obs, actions, rewards = columns.obs, columns.actions, columns.rewards
    extras = list(columns.extras.items())
    infos_of = columns.infos
    new_buf, new_ep = RlBuffer.__new__, RlSingleAgentEpisode.__new__
    out: list[RlSingleAgentEpisode] = []
    append = out.append

    with no_gc():  # thousands of small acyclic objects: no cyclic-GC passes meanwhile
        for i, (id_, e, a, b, lb, t_started, t, term, trunc) in enumerate(
            zip(
                columns.ids,
                columns.env,
                columns.first,
                columns.stop,
                columns.lookback,
                columns.t_started,
                columns.t,
                columns.terminated,
                columns.truncated,
            )
        ):
            ep: Any = new_ep(RlSingleAgentEpisode)
            x: Any
            ep.id_ = id_
            ep.agent_id = ep.module_id = ep.multi_agent_episode_id = None
            # RLlib's buffers, their fields as its __init__ sets them (inlined: 8 per episode)
            x = ep.observations = new_buf(RlBuffer)
            x.data, x.finalized, x.lookback = obs_at(obs, (e, slice(a, b + 1))), True, lb
            x._space, x._space_struct = obs_space, obs_struct
            x = ep.infos = new_buf(RlBuffer)
            x.data = data = infos_of(i)  # a list of dicts, or a struct of arrays
            x.finalized, x.lookback = type(data) is not list, lb
            x._space = x._space_struct = None
            x = ep.actions = new_buf(RlBuffer)
            x.data, x.finalized, x.lookback = actions[e, a:b], True, lb
            x._space, x._space_struct = act_space, act_struct
            x = ep.rewards = new_buf(RlBuffer)
            x.data, x.finalized, x.lookback = rewards[e, a:b], True, lb
            x._space, x._space_struct = rew_space, rew_struct
            ep.extra_model_outputs = model_outputs = {}
            for k, c in extras:
                x = model_outputs[k] = new_buf(RlBuffer)
                x.data, x.finalized, x.lookback = c[e, a:b], True, lb
                x._space = x._space_struct = None
            ep._observation_space, ep._action_space = obs_space, act_space
            ep.is_terminated, ep.is_truncated = term, trunc
            ep.t_started, ep.t = t_started, t
            ep._custom_data = {}
            ep._start_time = ep._last_step_time = None
            ep._last_added_observation = ep._last_added_infos = None
            append(ep)
    return out


# ----------------------------------------------------------------------- multi agent


def _per_agent(spaces_of: Any, convert: Callable[[Any], Any]) -> Any:
    """An episode's ``observation_space`` / ``action_space``: ``{agent_id: space}`` (the
    samplers' and RLlib's runners' form) or one space."""
    if isinstance(spaces_of, dict):
        return {k: convert(v) for k, v in spaces_of.items()}
    return convert(spaces_of)


def _maps_to_rl(maps: Any, spaces: _Spaces) -> defaultdict[Any, RlBuffer]:
    out: defaultdict[Any, RlBuffer] = defaultdict(RlBuffer)
    for aid, m in maps.items():
        out[aid] = _buf_to_rl(m, spaces)
    return out


def _maps_from_rl(maps: Any, spaces: _Spaces) -> defaultdict[Any, JsBuffer]:
    out: defaultdict[Any, JsBuffer] = defaultdict(JsBuffer)
    for aid, m in maps.items():
        out[aid] = _buf_from_rl(m, spaces)
    return out


def _mapping_fn_to_rl(fn: Any) -> Any:
    return _RL_DEFAULT_MAPPING if fn is _JS_DEFAULT_MAPPING else fn


def _mapping_fn_from_rl(fn: Any) -> Any:
    return _JS_DEFAULT_MAPPING if fn is _RL_DEFAULT_MAPPING else fn


def _hanging(ep: Any) -> tuple[dict, defaultdict, defaultdict, defaultdict]:
    """Copies of the four hanging caches (actions, extras, rewards end, rewards begin)."""
    return (
        dict(ep._hanging_actions_end),
        defaultdict(dict, {k: dict(v) for k, v in ep._hanging_extra_model_outputs_end.items()}),
        defaultdict(float, ep._hanging_rewards_end),
        defaultdict(float, ep._hanging_rewards_begin),
    )


def _ma_to_rllib(ep: JsMultiAgentEpisode, spaces: _Spaces) -> RlMultiAgentEpisode:
    """RLlib's episode with every field of ``ep``. RLlib's constructor only builds from
    per-step lists, so the fields are set as its ``from_state`` sets them (without the
    state's copies and space (de)serialization)."""
    out: Any = RlMultiAgentEpisode.__new__(RlMultiAgentEpisode)
    out.id_ = ep.id_
    out.agent_to_module_mapping_fn = _mapping_fn_to_rl(ep.agent_to_module_mapping_fn)
    out._agent_to_module_mapping = ep.agent_to_module_mapping  # a copy
    out.observation_space = _per_agent(ep.observation_space, spaces.to_gym)
    out.action_space = _per_agent(ep.action_space, spaces.to_gym)
    out.env_t_started, out.env_t = ep.env_t_started, ep.env_t
    out.agent_t_started = defaultdict(int, ep.agent_t_started)
    out.env_t_to_agent_t = _maps_to_rl(ep.env_t_to_agent_t, spaces)
    (
        out._hanging_actions_end,
        out._hanging_extra_model_outputs_end,
        out._hanging_rewards_end,
        out._hanging_rewards_begin,
    ) = _hanging(ep)
    out.is_terminated, out.is_truncated = ep.is_terminated, ep.is_truncated
    out.agent_episodes = {aid: _sa_to_rllib(sa, spaces) for aid, sa in ep.agent_episodes.items()}
    out._len_lookback_buffers = ep._len_lookback_buffers
    out._custom_data = dict(ep.custom_data)
    out._start_time, out._last_step_time = ep._start_time, ep._last_step_time
    return out


def _ma_from_rllib(ep: RlMultiAgentEpisode, spaces: _Spaces) -> JsMultiAgentEpisode:
    """jaxsampler's episode with every field of ``ep``: the constructor makes an empty
    episode (every field at its default), then the fields are set as ``from_state`` sets
    them, without its deep copy."""
    rl: Any = ep
    agent_episodes = {aid: _sa_from_rllib(sa, spaces) for aid, sa in rl.agent_episodes.items()}
    out = JsMultiAgentEpisode(
        rl.id_,
        observation_space=_per_agent(rl.observation_space, spaces.from_gym),
        action_space=_per_agent(rl.action_space, spaces.from_gym),
        env_t_started=rl.env_t_started,
        agent_t_started=dict(rl.agent_t_started),
        agent_module_ids=dict(rl._agent_to_module_mapping),
        agent_episode_ids={aid: sa.id_ for aid, sa in agent_episodes.items()},
        agent_to_module_mapping_fn=_mapping_fn_from_rl(rl.agent_to_module_mapping_fn),
    )
    out.start_at(rl.env_t_started, rl._len_lookback_buffers)
    # The remaining fields have no public setter on either class (multi_agent.py has no
    # trusted constructor for whole episodes yet); they are set as from_state sets them.
    out.env_t = rl.env_t
    out.agent_episodes = agent_episodes
    out.env_t_to_agent_t = _maps_from_rl(rl.env_t_to_agent_t, spaces)
    (
        out._hanging_actions_end,
        out._hanging_extra_model_outputs_end,
        out._hanging_rewards_end,
        out._hanging_rewards_begin,
    ) = _hanging(rl)
    out.is_terminated, out.is_truncated = rl.is_terminated, rl.is_truncated
    out.custom_data = dict(rl.custom_data)
    out._start_time, out._last_step_time = rl._start_time, rl._last_step_time
    return out


# ----------------------------------------------------------------------- batches


def _sb_convert(batch: Any, cls: type) -> Any:
    out = cls(
        dict(batch),
        _time_major=batch.time_major,
        _max_seq_len=batch.max_seq_len,
        _zero_padded=batch.zero_padded,
        _is_training=batch.is_training,
        _num_grad_updates=batch.num_grad_updates,
    )
    return out


def _sb_to_rllib(batch: JsSampleBatch, spaces: _Spaces) -> RlSampleBatch:
    return _sb_convert(batch, RlSampleBatch)


def _sb_from_rllib(batch: RlSampleBatch, spaces: _Spaces) -> JsSampleBatch:
    return _sb_convert(batch, JsSampleBatch)


def _mab_to_rllib(batch: JsMultiAgentBatch, spaces: _Spaces) -> RlMultiAgentBatch:
    return RlMultiAgentBatch(
        {k: _sb_to_rllib(v, spaces) for k, v in batch.policy_batches.items()}, batch.count
    )


def _mab_from_rllib(batch: RlMultiAgentBatch, spaces: _Spaces) -> JsMultiAgentBatch:
    return JsMultiAgentBatch(
        {k: _sb_from_rllib(v, spaces) for k, v in batch.policy_batches.items()}, batch.count
    )


# ----------------------------------------------------------------------- dispatch

_TO: dict[type, Callable[[Any, _Spaces], Any]] = {
    JsSingleAgentEpisode: _sa_to_rllib,
    JsMultiAgentEpisode: _ma_to_rllib,
    JsSampleBatch: _sb_to_rllib,
    JsMultiAgentBatch: _mab_to_rllib,
}
_FROM: dict[type, Callable[[Any, _Spaces], Any]] = {
    RlSingleAgentEpisode: _sa_from_rllib,
    RlMultiAgentEpisode: _ma_from_rllib,
    RlSampleBatch: _sb_from_rllib,
    RlMultiAgentBatch: _mab_from_rllib,
}
_RL_TYPES = tuple(_FROM)
_JS_TYPES = tuple(_TO)


def _lookup(table: dict[type, Callable[[Any, _Spaces], Any]], obj: Any) -> Any:
    fn = table.get(type(obj))
    if fn is None:  # a subclass
        for cls, f in table.items():
            if isinstance(obj, cls):
                return f
    return fn


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pauses the cyclic garbage collector while a list converts: the conversion makes
    ~15 small acyclic objects per episode, and the full collections that thousands of them
    trigger cost several times the conversion itself (measured: 45 vs 7 us per episode).
    Nothing made here is cyclic, so nothing waits for the collector meanwhile."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def to_rllib(obj: Any) -> Any:
    """Converts jaxsampler episodes / batches into RLlib's (ray 2.60) classes, exactly.

    Args:
        obj: a jaxsampler ``SingleAgentEpisode``, ``MultiAgentEpisode``, ``SampleBatch`` or
            ``MultiAgentBatch``, or a list / tuple of them. RLlib objects pass through
            unchanged.

    Returns:
        The RLlib object of the same class name, or a list of them for a list / tuple. The
        numpy arrays are shared, not copied (see the module docstring); spaces become
        ``gymnasium.spaces``.

    Raises:
        TypeError: ``obj`` (or an item of the list) is of a type RLlib cannot represent, or
            holds a space that has no gymnasium equivalent.
    """
    spaces = _Spaces()
    if isinstance(obj, (list, tuple)):
        with _gc_paused():
            return [_to_one(x, spaces) for x in obj]
    return _to_one(obj, spaces)


def _to_one(obj: Any, spaces: _Spaces) -> Any:
    fn = _lookup(_TO, obj)
    if fn is not None:
        return fn(obj, spaces)
    if isinstance(obj, _RL_TYPES):
        return obj
    raise TypeError(
        f"to_rllib: cannot convert {type(obj).__module__}.{type(obj).__qualname__} to an RLlib "
        f"object; supported: {_SUPPORTED_TO}"
    )


def from_rllib(obj: Any) -> Any:
    """Converts RLlib's (ray 2.60) episodes / batches into jaxsampler's classes, exactly.

    The inverse of :func:`to_rllib`: ``from_rllib(to_rllib(x))`` equals ``x`` field by
    field, and ``to_rllib(from_rllib(y))`` equals ``y``.

    Args:
        obj: an RLlib ``SingleAgentEpisode``, ``MultiAgentEpisode``, ``SampleBatch`` or
            ``MultiAgentBatch``, or a list / tuple of them. jaxsampler objects pass through
            unchanged.

    Returns:
        The jaxsampler object of the same class name, or a list of them for a list / tuple;
        arrays shared, gymnasium spaces converted to jaxsampler spaces.

    Raises:
        TypeError: ``obj`` (or an item) is of another type, or holds a space jaxsampler has
            no equivalent for.
    """
    spaces = _Spaces()
    if isinstance(obj, (list, tuple)):
        with _gc_paused():
            return [_from_one(x, spaces) for x in obj]
    return _from_one(obj, spaces)


def _from_one(obj: Any, spaces: _Spaces) -> Any:
    fn = _lookup(_FROM, obj)
    if fn is not None:
        return fn(obj, spaces)
    if isinstance(obj, _JS_TYPES):
        return obj
    raise TypeError(
        f"from_rllib: cannot convert {type(obj).__module__}.{type(obj).__qualname__} to a "
        f"jaxsampler object; supported: {_SUPPORTED_FROM}"
    )
