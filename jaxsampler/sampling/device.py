"""``DeviceSampler``: the sampler (RLlib's ``EnvRunner`` role) of pure-JAX envs.

``DeviceSampler.sample(params)`` runs whole ``rollout_length`` device chunks and turns them
into numpy'ized :class:`SingleAgentEpisode` objects, following RLlib's
``SingleAgentEnvRunner.sample()``,
adapted to a device that runs whole chunks:

* jaxsampler's next-step auto-reset *is* Gymnasium's NEXT_STEP mode: reset steps
  deliver the new episode's first observation and are not counted as timesteps;
* ``num_timesteps=N``: as many rollout calls as needed until at least ``N`` (non-reset)
  env steps were taken; every step sampled is returned exactly once (nothing dropped);
* ``num_episodes=N``: all envs are reset first (ongoing episodes are discarded, as in
  RLlib), then calls run until ``N`` episodes have finished; the episodes that finished
  up to the step at which the count reached ``N`` are returned, and the next call resets
  again;
* neither: one rollout call;
* ongoing episodes are returned as chunks (``t > 0``) and continue in the next call with
  the same ``id_``, ``t_started`` = the previous chunk's ``t`` and a lookback of up to
  ``episode_lookback_horizon`` steps taken from the previous chunk.

Conversion is vectorized: one bulk device-to-host copy per call, one bulk transpose to
env-major arrays (with the lookback steps prepended), episode boundaries from the
``is_reset`` flags with ``np.nonzero``; each episode's columns are numpy views (slices)
of those arrays. The only Python loop is over episodes, never over timesteps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from jaxsampler.constants import DEFAULT_POLICY_ID
from jaxsampler.envs.base import Env
from jaxsampler.episodes.batch import MultiAgentBatch, SampleBatch
from jaxsampler.episodes.ids import EpisodeIds
from jaxsampler.episodes.lookback import InfiniteLookbackBuffer
from jaxsampler.episodes.single_agent import SingleAgentEpisode, _reward_space
from jaxsampler.policies.base import Policy
from jaxsampler.rollout import init_state_and_info, jit_rollout, make_rollout
from jaxsampler.sampling.agent_steps import AgentCarry
from jaxsampler.sampling.base import Sampler, SamplerMetrics, check_lookback, check_sample_counts
from jaxsampler.sampling.multi_agent import MultiAgentSampling, _no_gc, _unflatten
from jaxsampler.types import NoInfo, Trajectory

__all__ = ["DeviceSampler"]


class DeviceSampler(MultiAgentSampling, Sampler):
    """The :class:`~jaxsampler.sampling.base.Sampler` of a pure-JAX env: each call runs
    whole jitted rollout chunks and converts them in bulk on the host.

    Args:
        env: a jaxsampler env, a registered env id (``js.make``), or a host-stepped env.
        policy: the policy (``(params, obs, key, state) -> (action, extras, state)``).
        num_envs: envs stepped side by side (the env axis).
        rollout_length: device steps per rollout call.
        seed: PRNG seed; the same seed and calls give identical episodes.
        env_params: env params (default ``env.default_params``).
        episode_lookback_horizon: lookback steps carried into continuation chunks.
    """

    def __init__(
        self,
        env: Env | str,
        policy: Policy,
        num_envs: int = 1,
        rollout_length: int = 128,
        seed: int = 0,
        *,
        env_params: Any = None,
        episode_lookback_horizon: int = 1,
    ):
        if isinstance(env, str):
            from jaxsampler.registry import make

            env = make(env)
        check_lookback(episode_lookback_horizon)
        self.env, self.policy = env, policy
        self.num_envs, self.rollout_length = num_envs, rollout_length
        self.env_params = env.default_params if env_params is None else env_params
        self.horizon = episode_lookback_horizon
        self._rollout = jit_rollout(make_rollout(env, policy, num_envs, rollout_length))
        self._key = jax.random.PRNGKey(seed)
        self._episode_id = EpisodeIds(seed)  # (env, count) -> id, deterministic per seed
        self._state = None
        self._buffers: Trajectory | None = None
        self._tail: dict[str, Any] | None = None
        self._partial_return = np.zeros(num_envs, np.float64)
        self.metrics = SamplerMetrics()
        self._obs_space, self._act_space = env.observation_space, env.action_space
        self._has_infos = None
        self._reset_info: dict[str, np.ndarray] = {}
        self._act_zero = np.asarray(jax.tree.leaves(env.action_space.zeros())[0])
        # Multi-agent: agents' policy ids, carried hanging steps, open episode chunks.
        self.multi_agent = env.num_agents != 1
        self.agent_ids = tuple(env.agent_ids)
        self.agent_policy = tuple(
            getattr(policy, "agent_policy", None) or (DEFAULT_POLICY_ID,) * env.num_agents
        )
        self._carry: AgentCarry | None = None
        self._open: dict[int, Any] = {}
        self._col_horizon = 1 if self.multi_agent else self.horizon  # multi-agent: infos of slot 0

    # ------------------------------------------------------------------------- state

    def reset(self) -> None:
        """Resets every env; ongoing episodes are discarded."""
        self._key, k = jax.random.split(self._key)
        self._state, info = init_state_and_info(
            self.env, self.policy, self.num_envs, k, self.env_params
        )
        self._reset_info = {
            "info:" + "/".join(path): np.asarray(leaf) for path, leaf in _info_leaves(info)
        }
        self._episode_id.new_run()
        self._tail = None
        self._partial_return[:] = 0.0
        self._carry = None
        self._open = {}

    def _call(self, params: Any) -> Trajectory:
        self._state, traj = self._rollout(params, self._state, self._buffers)
        host = jax.device_get(traj)  # one transfer per call
        if self.multi_agent:  # agents acting on the last observation (it completes their step)
            self._next_acting = np.asarray(
                jax.device_get(self._state.acting & ~self._state.needs_reset[:, None])
            )
        self._buffers = traj
        return host

    # ------------------------------------------------------------------------- sampling

    def sample(
        self,
        params: Any,
        num_timesteps: int | None = None,
        num_episodes: int | None = None,
        force_reset: bool = False,
    ) -> list[SingleAgentEpisode]:
        """Samples and returns numpy'ized episodes: finished ones, then ongoing chunks.

        Args:
            params: policy params.
            num_timesteps: sample until at least this many env steps (reset steps not
                counted); whole rollout calls only, so possibly more.
            num_episodes: reset, then sample until this many episodes finished.
            force_reset: reset all envs first (ongoing episodes are discarded).

        Metrics of the call are in :attr:`metrics`.
        """
        return self._sample(
            params,
            num_timesteps,
            num_episodes,
            force_reset,
            self._to_ma_episodes if self.multi_agent else self._to_episodes,
        )

    def sample_batch(
        self,
        params: Any,
        num_timesteps: int | None = None,
        num_episodes: int | None = None,
        force_reset: bool = False,
    ) -> MultiAgentBatch:
        """Like :meth:`sample`, but returns a ``MultiAgentBatch`` (``"default_policy"`` ->
        ``SampleBatch``) built straight from the device buffers, one row per sampled step.

        Columns: ``obs``, ``new_obs`` (derived from the single observation track),
        ``actions``, ``rewards``, ``terminateds``, ``truncateds``, ``t``, ``eps_id`` (the
        episodes' ``id_``), ``agent_index``, ``infos`` and the policy's extras
        (``action_logp``, ``vf_preds``, ...). Rows come episode by episode in the order
        :meth:`sample` would return the episodes. Episodes continue across calls exactly
        as with :meth:`sample` (the two may be mixed).
        """
        return self._sample(
            params,
            num_timesteps,
            num_episodes,
            force_reset,
            self._to_ma_batch if self.multi_agent else self._to_batch,
        )

    def _sample(
        self,
        params: Any,
        num_timesteps: int | None,
        num_episodes: int | None,
        force_reset: bool,
        build: Any,
    ):
        check_sample_counts(num_timesteps, num_episodes)
        if self._state is None or force_reset or num_episodes is not None:
            self.reset()
        chunks, steps = [], 0
        while True:
            traj = self._call(params)
            chunks.append(traj)
            steps += int(np.count_nonzero(~traj.is_reset))
            if num_episodes is not None:
                if self._count_done(chunks) >= num_episodes:
                    break
            elif num_timesteps is None or steps >= num_timesteps:
                break
        out, metrics = build(chunks, num_episodes)
        metrics.num_rollout_calls = len(chunks)
        self.metrics = metrics
        if num_episodes is not None:
            self._state = None  # the next call starts fresh, as RLlib does
        return out

    def _count_done(self, chunks: list[Trajectory]) -> int:
        # An episode ends at the step where every agent is done (flags are sticky).
        return sum(
            int(np.count_nonzero(np.all(c.terminated | c.truncated, axis=-1) & ~c.is_reset))
            for c in chunks
        )

    # ------------------------------------------------------------------------- conversion

    def _columns(self, chunks: list[Trajectory]) -> dict[str, Any]:
        """Env-major arrays ``[E, H + T_total (+1 for obs), ...]`` with the lookback prefix."""
        H = self._col_horizon

        def cat(get, with_obs_slot: bool = False) -> Any:
            parts = [get(c) for c in chunks]
            if with_obs_slot:  # obs: T + 1 slots per call, consecutive calls share one
                parts = [p[:-1] for p in parts[:-1]] + [parts[-1]]
            head = self._tail[get.__name__] if self._tail is not None else None
            if head is None and H and get.__name__ in self._reset_info:
                # The first observations' info (from the reset): the head's last slot.
                first = self._reset_info[get.__name__]
                head = np.zeros((first.shape[0], H) + first.shape[1:], first.dtype)
                head[:, -1] = first
            if self.multi_agent and get.__name__ == "obs":
                return _agent_major(parts, head, H)
            return _env_major(parts, head, H)

        agent = slice(None) if self.multi_agent else 0  # multi-agent columns keep the agent axis

        def obs(c):
            return c.obs[:, :, agent]  # noqa: E704

        def actions(c):
            return c.actions[:, :, agent]  # noqa: E704

        def rewards(c):
            return c.rewards[:, :, agent]  # noqa: E704

        def terminated(c):
            return c.terminated[:, :, agent]  # noqa: E704

        def truncated(c):
            return c.truncated[:, :, agent]  # noqa: E704

        def is_reset(c):
            return c.is_reset  # noqa: E704

        cols = {
            "obs": cat(obs, True),
            "actions": cat(actions),
            "rewards": cat(rewards),
            "terminated": cat(terminated),
            "truncated": cat(truncated),
            "is_reset": cat(is_reset),
        }
        if self.multi_agent:

            def acting(c):
                return c.acting  # noqa: E704

            cols["acting"] = cat(acting)
        keys = sorted(chunks[0].extras) if isinstance(chunks[0].extras, dict) else []
        for k in keys:

            def extra(c, k=k):
                return c.extras[k][:, :, agent]  # noqa: E704

            extra.__name__ = f"extra:{k}"
            cols[f"extra:{k}"] = cat(extra)
        for path, _ in _info_leaves(chunks[0].infos):

            def info(c, path=path):
                return _info_get(c.infos, path)  # noqa: E704

            info.__name__ = "info:" + "/".join(path)
            cols[info.__name__] = cat(info)
        # Keep the last H steps (and H + 1 observations) for the next call's lookback.
        self._tail = {
            name: _tail(col, H, name == "obs")
            for name, col in cols.items()
            if not (self.multi_agent and name == "obs")
        }
        if self.multi_agent:  # agent-major observations [E, A, H + T + 1, ...]
            obs_col = cols["obs"]
            self._tail["obs"] = obs_col[
                :, :, obs_col.shape[2] - 1 - H : obs_col.shape[2] - 1
            ].copy()
        if self.multi_agent:
            # Episode-level views for the segmentation: the episode ends when every agent
            # is done; it counts as truncated if some agent was truncated at that step.
            for name in ("rewards", "terminated", "truncated"):
                cols["agent_" + name] = cols[name]
            done = np.all(cols["terminated"] | cols["truncated"], axis=2)
            cols["terminated"] = done
            cols["truncated"] = done & np.any(cols["agent_truncated"], axis=2)
            cols["rewards"] = cols["agent_rewards"].sum(axis=2, dtype=np.float64)
        return cols

    def _segments(self, chunks: list[Trajectory], num_episodes: int | None):
        """Episode segments of the sampled chunks, in output order (finished ones first).

        Returns ``(cols, seg, metrics)``: the env-major columns and a dict of per-segment
        arrays (``env``, ``start``, ``len``, ``lookback``, ``t_started``, ``term``,
        ``trunc``, ``count``). All vectorized; also updates the carried partial returns.
        """
        H, E = self._col_horizon, self.num_envs
        first = chunks[0]
        step0 = np.asarray(first.episode_step_0)
        count0 = np.asarray(first.episode_count_0)
        fresh_tail = self._tail is None
        cols = self._columns(chunks)
        is_reset = cols["is_reset"]
        total = is_reset.shape[1] - H
        live = ~is_reset[:, H:]
        done = (cols["terminated"][:, H:] | cols["truncated"][:, H:]) & live
        # Runs of non-reset steps are episode segments.
        prev = np.concatenate([np.zeros((E, 1), bool), live[:, :-1]], axis=1)
        nxt = np.concatenate([live[:, 1:], np.zeros((E, 1), bool)], axis=1)
        seg_env, seg_start = np.nonzero(live & ~prev)
        _, seg_end = np.nonzero(live & ~nxt)  # inclusive, same (env, time) order
        seg_len = seg_end - seg_start + 1
        resets_before = np.cumsum(is_reset[:, H:], axis=1)
        count = count0[seg_env] + resets_before[seg_env, seg_start]
        continues = (seg_start == 0) & (step0[seg_env] > 0)
        t_started = np.where(continues, step0[seg_env], 0)
        lookback = np.where(continues, np.minimum(H if not fresh_tail else 0, step0[seg_env]), 0)
        is_done = done[seg_env, seg_end]
        term = cols["terminated"][seg_env, H + seg_end] & is_done
        trunc = cols["truncated"][seg_env, H + seg_end] & is_done
        # Returns (vectorized): segment sums plus what earlier calls accumulated.
        rew = cols["rewards"][:, H:].astype(np.float64)
        csum = np.concatenate([np.zeros((E, 1)), np.cumsum(rew * live, axis=1)], axis=1)
        seg_sum = csum[seg_env, seg_end + 1] - csum[seg_env, seg_start]
        seg_return = seg_sum + np.where(continues, self._partial_return[seg_env], 0.0)
        if num_episodes is not None:  # stop at the step where the count reached N
            by_end = np.lexsort((seg_env, seg_end))
            finished = by_end[is_done[by_end]]
            cutoff = seg_end[finished[num_episodes - 1]]
            keep = is_done & (seg_end <= cutoff)
        else:
            keep = np.ones(len(seg_env), bool)
        # Carry partial returns of the episodes still running at the end of the call.
        ongoing = ~is_done & (seg_end == total - 1)
        self._partial_return[:] = 0.0
        self._partial_return[seg_env[ongoing]] = seg_return[ongoing]
        order = np.concatenate([np.nonzero(keep & is_done)[0], np.nonzero(keep & ~is_done)[0]])
        seg = {
            "env": seg_env[order],
            "start": seg_start[order],
            "len": seg_len[order],
            "lookback": lookback[order],
            "t_started": t_started[order],
            "term": term[order],
            "trunc": trunc[order],
            "count": count[order],
        }
        m = SamplerMetrics(num_env_steps_sampled=int(np.count_nonzero(live)))
        m.num_agent_steps_sampled = m.num_env_steps_sampled  # multi-agent: set by the caller
        fin = keep & is_done
        m.num_episodes_completed = int(fin.sum())
        m.num_episodes_ongoing = int((keep & ~is_done).sum())
        if fin.any():
            rets, lens = seg_return[fin], (t_started + seg_len)[fin]
            m.episode_return_mean, m.episode_return_min, m.episode_return_max = (
                float(rets.mean()),
                float(rets.min()),
                float(rets.max()),
            )
            m.episode_len_mean, m.episode_len_min, m.episode_len_max = (
                float(lens.mean()),
                float(lens.min()),
                float(lens.max()),
            )
        return cols, seg, m

    def _to_episodes(self, chunks: list[Trajectory], num_episodes: int | None):
        cols, seg, m = self._segments(chunks, num_episodes)
        extra_cols = [(name[6:], col) for name, col in cols.items() if name.startswith("extra:")]
        info_cols = [(name[5:], col) for name, col in cols.items() if name.startswith("info:")]
        names = ("env", "start", "len", "lookback", "t_started", "term", "trunc", "count")
        fields = zip(*(seg[k].tolist() for k in names))
        with _no_gc():  # thousands of small objects: skip cyclic-GC passes while building them
            episodes = [self._episode(cols, extra_cols, info_cols, *f) for f in fields]
        return episodes, m

    def _to_batch(self, chunks: list[Trajectory], num_episodes: int | None):
        """One ``SampleBatch`` row per sampled (non-reset) step, episodes in ``sample()``'s
        order, built with fancy indexing over the env-major columns (no per-step loop)."""
        cols, seg, m = self._segments(chunks, num_episodes)
        H = self.horizon
        lens = seg["len"]
        n_rows = int(lens.sum())
        seg_of_row = np.repeat(np.arange(len(lens)), lens)
        offset = np.arange(n_rows) - np.repeat(np.cumsum(lens) - lens, lens)
        e = seg["env"][seg_of_row]
        j = H + seg["start"][seg_of_row] + offset
        ids = np.array(
            [self._episode_id(a, c) for a, c in zip(seg["env"].tolist(), seg["count"].tolist())]
            or [""]
        )
        data: dict[str, Any] = {
            SampleBatch.OBS: cols["obs"][e, j],
            SampleBatch.NEXT_OBS: cols["obs"][e, j + 1],
            SampleBatch.ACTIONS: cols["actions"][e, j],
            SampleBatch.REWARDS: cols["rewards"][e, j],
            SampleBatch.TERMINATEDS: cols["terminated"][e, j],
            SampleBatch.TRUNCATEDS: cols["truncated"][e, j],
            SampleBatch.T: (seg["t_started"][seg_of_row] + offset).astype(np.int64),
            SampleBatch.EPS_ID: ids[seg_of_row] if n_rows else np.array([], ids.dtype),
            SampleBatch.AGENT_INDEX: np.zeros(n_rows, np.int64),
        }
        info_cols = [(name[5:], col) for name, col in cols.items() if name.startswith("info:")]
        if info_cols:
            # The info of the observation at step j was recorded with step j - 1.
            data[SampleBatch.INFOS] = _unflatten(
                {k: _info_for_obs(col, e, j) for k, col in info_cols}
            )
        else:
            data[SampleBatch.INFOS] = [{}] * n_rows
        for name, col in cols.items():
            if name.startswith("extra:"):
                data[name[6:]] = col[e, j]
        return MultiAgentBatch({DEFAULT_POLICY_ID: SampleBatch(data)}, n_rows), m

    def _episode(
        self,
        cols: dict[str, Any],
        extra_cols: list,
        info_cols: list,
        e: int,
        start: int,
        length: int,
        lb: int,
        t_started: int,
        term: bool,
        trunc: bool,
        count: int,
    ) -> SingleAgentEpisode:
        H = self.horizon
        a, b = H + start - lb, H + start + length  # step range incl. lookback
        trusted = InfiniteLookbackBuffer.trusted
        if info_cols:
            # Env infos come with the step that produced each observation: the info of
            # observation j + 1 was recorded at step j (the first observation's is zeros).
            slots = np.arange(a, b + 1)
            infos = trusted(
                _unflatten({k: _info_for_obs(col, e, slots) for k, col in info_cols}), lb
            )
        else:
            infos = trusted([{}] * (length + lb + 1), lb)
        return SingleAgentEpisode.trusted(
            self._episode_id(e, count),
            observations=trusted(cols["obs"][e, a : b + 1], lb, self._obs_space),
            infos=infos,
            actions=trusted(cols["actions"][e, a:b], lb, self._act_space),
            rewards=trusted(cols["rewards"][e, a:b], lb, _reward_space()),
            extra_model_outputs={name: trusted(col[e, a:b], lb) for name, col in extra_cols},
            observation_space=self._obs_space,
            action_space=self._act_space,
            terminated=term,
            truncated=trunc,
            t_started=t_started,
        )


def _env_major(parts: Sequence[np.ndarray], head: np.ndarray | None, H: int) -> np.ndarray:
    """``[E, H + sum(T_i), ...]``: the lookback head (zeros if none) then each part, transposed."""
    E = parts[0].shape[1]
    total = sum(p.shape[0] for p in parts)
    out = np.empty((E, H + total) + parts[0].shape[2:], parts[0].dtype)
    if head is None:
        out[:, :H] = 0
    else:
        out[:, :H] = head
    pos = H
    for p in parts:
        out[:, pos : pos + p.shape[0]] = p.swapaxes(0, 1)
        pos += p.shape[0]
    return out


def _agent_major(parts: Sequence[np.ndarray], head: np.ndarray | None, H: int) -> np.ndarray:
    """``[E, A, H + sum(T_i), ...]`` from time-major parts ``[T_i, E, A, ...]``."""
    T0, E, A = parts[0].shape[:3]
    total = sum(p.shape[0] for p in parts)
    out = np.empty((E, A, H + total) + parts[0].shape[3:], parts[0].dtype)
    out[:, :, :H] = 0 if head is None else head
    pos = H
    for p in parts:
        out[:, :, pos : pos + p.shape[0]] = np.moveaxis(p, 0, 2)
        pos += p.shape[0]
    return out


def _tail(col: np.ndarray, H: int, is_obs: bool) -> np.ndarray:
    """The last ``H`` steps of an env-major column (for obs: the H observations before the
    last slot, which the next call's first slot repeats)."""
    if is_obs:
        return col[:, col.shape[1] - 1 - H : col.shape[1] - 1].copy()
    return col[:, col.shape[1] - H :].copy()


def _info_leaves(infos: Any, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """``(path, leaf)`` pairs of an env info pytree (dicts and dataclasses by field name)."""
    if isinstance(infos, NoInfo):
        return []
    if isinstance(infos, dict):
        items = sorted(infos.items())
    elif dataclasses.is_dataclass(infos):
        items = [(f.name, getattr(infos, f.name)) for f in dataclasses.fields(infos)]
    else:
        return [(prefix or ("info",), infos)]
    out = []
    for k, v in items:
        out += _info_leaves(v, prefix + (str(k),))
    return out


def _info_get(infos: Any, path: tuple[str, ...]) -> np.ndarray:
    for k in path:
        if isinstance(infos, dict):
            infos = infos[k]
        elif dataclasses.is_dataclass(infos):
            infos = getattr(infos, k)
    return np.asarray(infos)


def _info_for_obs(col: np.ndarray, e: Any, j: np.ndarray) -> np.ndarray:
    """Env info of observation slots ``j`` (env-major column): recorded with step ``j - 1``;
    zeros for slot 0, whose info the buffers do not hold."""
    values = col[e, np.maximum(j - 1, 0)]
    first = (j == 0).reshape(j.shape + (1,) * (values.ndim - j.ndim))
    return np.where(first, np.zeros((), values.dtype), values)
