"""``Sampler``: the host-side sampler (RLlib's ``EnvRunner`` role) over the jitted rollout.

``Sampler.sample(params)`` runs whole ``rollout_length`` device chunks and turns them
into numpy'ized :class:`SingleAgentEpisode` objects, following RLlib's
``SingleAgentEnvRunner.sample()`` (``shared/reference/rllib-semantics.md`` section 7),
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

import contextlib
import dataclasses
import gc
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from jaxsampler.env import Env
from jaxsampler.host.batch import DEFAULT_POLICY_ID, MultiAgentBatch, SampleBatch
from jaxsampler.host.agent_steps import AgentCarry, AgentSteps, agent_steps, take, take_info
from jaxsampler.host.episode import SingleAgentEpisode, _reward_space
from jaxsampler.host.lookback import InfiniteLookbackBuffer, batch, tree_map
from jaxsampler.host.multi_agent_episode import SKIP, MultiAgentEpisode
from jaxsampler.policies.base import Policy
from jaxsampler.rollout import init_state_and_info, jit_rollout, make_rollout
from jaxsampler.types import NoInfo, Trajectory

__all__ = ["Sampler", "SamplerMetrics"]


@dataclasses.dataclass
class SamplerMetrics:
    """Per-``sample()`` statistics: what every training loop logs.

    ``episode_*`` statistics cover the episodes *completed* in the call (NaN if none);
    ``num_episodes_ongoing`` counts chunks of episodes still running.
    """

    num_env_steps_sampled: int = 0
    num_agent_steps_sampled: int = 0
    num_episodes_completed: int = 0
    num_episodes_ongoing: int = 0
    episode_return_mean: float = float("nan")
    episode_return_min: float = float("nan")
    episode_return_max: float = float("nan")
    episode_len_mean: float = float("nan")
    episode_len_min: float = float("nan")
    episode_len_max: float = float("nan")
    num_rollout_calls: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _fast_buffer(data: Any, lookback: int, space: Any = None) -> InfiniteLookbackBuffer:
    """A buffer without the constructor's checks (data already validated); a list stays
    in list mode, anything else is numpy'ized."""
    buf = InfiniteLookbackBuffer.__new__(InfiniteLookbackBuffer)
    buf.data, buf.finalized, buf.lookback = data, not isinstance(data, list), lookback
    buf._space, buf._struct = space, None
    return buf


def _host_env(env: Any, num_envs: int, seed: int) -> Any:
    """``env`` as a :class:`~jaxsampler.hostenv.HostEnv` if it is host-stepped (a HostEnv, a
    Gymnasium env, a list of envs or factories, or ``"gym:<id>"``), else ``None``."""
    from jaxsampler.hostenv import GymnasiumVectorEnv, HostEnv

    if isinstance(env, HostEnv):
        return env
    if type(env).__module__.startswith("gymnasium.vector"):
        from jaxsampler.hostenv.gym_vector import GymnasiumVectorAdapter

        return GymnasiumVectorAdapter(env, seed=seed)
    if isinstance(env, str) and env.startswith("gym:"):
        return GymnasiumVectorEnv(env[len("gym:"):], num_envs, seed=seed)
    if isinstance(env, (list, tuple)) or (
        not isinstance(env, (Env, str)) and hasattr(env, "step") and hasattr(env, "reset")
        and type(env).__module__.split(".")[0] not in ("jaxsampler", "gymnax")
    ):
        return GymnasiumVectorEnv(env if isinstance(env, (list, tuple)) else [env], seed=seed)
    return None


class Sampler:
    """Samples episodes from an env with a policy, on the host side.

    With a pure-JAX env the whole chunk is one jitted rollout. With a host-stepped env (a
    :class:`~jaxsampler.hostenv.HostEnv`, a Gymnasium env or list of envs / factories, or
    ``"gym:<id>"``) ``Sampler(...)`` returns a :class:`~jaxsampler.hostenv.HostSampler`:
    the same ``sample()`` / ``sample_batch()`` outputs, env steps on the host and one
    jitted, batched policy call per step.

    Args:
        env: a jaxsampler env, a registered env id (``js.make``), or a host-stepped env.
        policy: the policy (``(params, obs, key, state) -> (action, extras, state)``).
        num_envs: envs stepped side by side (the env axis).
        rollout_length: device steps per rollout call.
        seed: PRNG seed; the same seed and calls give identical episodes.
        env_params: env params (default ``env.default_params``).
        episode_lookback_horizon: lookback steps carried into continuation chunks.
    """

    def __new__(cls, env: Any, policy: Policy, num_envs: int = 1, rollout_length: int = 128, seed: int = 0, *,
                env_params: Any = None, episode_lookback_horizon: int = 1):
        if cls is Sampler:
            host = _host_env(env, num_envs, seed)
            if host is not None:
                from jaxsampler.hostenv import HostSampler

                if env_params is not None:
                    raise ValueError("env_params are for pure-JAX envs; configure a host-stepped env directly")
                return HostSampler(host, policy, seed=seed, episode_lookback_horizon=episode_lookback_horizon,
                                   rollout_length=rollout_length)
        return super().__new__(cls)

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
        if not isinstance(episode_lookback_horizon, int) or episode_lookback_horizon < 0:
            raise ValueError(f"episode_lookback_horizon must be an int >= 0, got {episode_lookback_horizon!r}")
        self.env, self.policy = env, policy
        self.num_envs, self.rollout_length = num_envs, rollout_length
        self.env_params = env.default_params if env_params is None else env_params
        self.horizon = episode_lookback_horizon
        self._rollout = jit_rollout(make_rollout(env, policy, num_envs, rollout_length))
        self._key = jax.random.PRNGKey(seed)
        self._run_id = np.random.default_rng(seed).bytes(7).hex()  # episode ids: deterministic per seed
        self._resets = 0
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
        self.agent_policy = tuple(getattr(policy, "agent_policy", None) or (DEFAULT_POLICY_ID,) * env.num_agents)
        if getattr(policy, "agent_ids", None) is not None and tuple(policy.agent_ids) != self.agent_ids:
            raise ValueError(f"mismatched agent ids: env has {self.agent_ids}, policy was built for {tuple(policy.agent_ids)}")
        self._carry: AgentCarry | None = None
        self._open: dict[int, Any] = {}
        self._col_horizon = 1 if self.multi_agent else self.horizon  # multi-agent: infos of slot 0

    # ------------------------------------------------------------------------- state

    def reset(self) -> None:
        """Resets every env; ongoing episodes are discarded."""
        self._key, k = jax.random.split(self._key)
        self._state, info = init_state_and_info(self.env, self.policy, self.num_envs, k, self.env_params)
        self._reset_info = {"info:" + "/".join(path): np.asarray(leaf) for path, leaf in _info_leaves(info)}
        self._resets += 1
        self._tail = None
        self._partial_return[:] = 0.0
        self._carry = None
        self._open = {}

    def _call(self, params: Any) -> Trajectory:
        self._state, traj = self._rollout(params, self._state, self._buffers)
        host = jax.device_get(traj)  # one transfer per call
        if self.multi_agent:  # agents acting on the last observation (it completes their step)
            self._next_acting = np.asarray(jax.device_get(self._state.acting & ~self._state.needs_reset[:, None]))
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
        return self._sample(params, num_timesteps, num_episodes, force_reset,
                            self._to_ma_episodes if self.multi_agent else self._to_episodes)

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
        return self._sample(params, num_timesteps, num_episodes, force_reset,
                            self._to_ma_batch if self.multi_agent else self._to_batch)

    def _sample(self, params: Any, num_timesteps: int | None, num_episodes: int | None, force_reset: bool, build: Any):
        if num_timesteps is not None and num_episodes is not None:
            raise ValueError("give num_timesteps or num_episodes, not both")
        for name, v in (("num_timesteps", num_timesteps), ("num_episodes", num_episodes)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1):
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
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
        return sum(int(np.count_nonzero(np.all(c.terminated | c.truncated, axis=-1) & ~c.is_reset)) for c in chunks)

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

        def obs(c): return c.obs[:, :, agent]  # noqa: E704
        def actions(c): return c.actions[:, :, agent]  # noqa: E704
        def rewards(c): return c.rewards[:, :, agent]  # noqa: E704
        def terminated(c): return c.terminated[:, :, agent]  # noqa: E704
        def truncated(c): return c.truncated[:, :, agent]  # noqa: E704
        def is_reset(c): return c.is_reset  # noqa: E704

        cols = {
            "obs": cat(obs, True),
            "actions": cat(actions),
            "rewards": cat(rewards),
            "terminated": cat(terminated),
            "truncated": cat(truncated),
            "is_reset": cat(is_reset),
        }
        if self.multi_agent:
            def acting(c): return c.acting  # noqa: E704
            cols["acting"] = cat(acting)
        keys = sorted(chunks[0].extras) if isinstance(chunks[0].extras, dict) else []
        for k in keys:
            def extra(c, k=k): return c.extras[k][:, :, agent]  # noqa: E704
            extra.__name__ = f"extra:{k}"
            cols[f"extra:{k}"] = cat(extra)
        for path, _ in _info_leaves(chunks[0].infos):
            def info(c, path=path): return _info_get(c.infos, path)  # noqa: E704
            info.__name__ = "info:" + "/".join(path)
            cols[info.__name__] = cat(info)
        # Keep the last H steps (and H + 1 observations) for the next call's lookback.
        self._tail = {name: _tail(col, H, name == "obs") for name, col in cols.items() if not (self.multi_agent and name == "obs")}
        if self.multi_agent:  # agent-major observations [E, A, H + T + 1, ...]
            obs_col = cols["obs"]
            self._tail["obs"] = obs_col[:, :, obs_col.shape[2] - 1 - H : obs_col.shape[2] - 1].copy()
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
            "env": seg_env[order], "start": seg_start[order], "len": seg_len[order],
            "lookback": lookback[order], "t_started": t_started[order], "term": term[order],
            "trunc": trunc[order], "count": count[order],
        }
        m = SamplerMetrics(num_env_steps_sampled=int(np.count_nonzero(live)))
        m.num_agent_steps_sampled = m.num_env_steps_sampled  # multi-agent: set by the caller
        fin = keep & is_done
        m.num_episodes_completed = int(fin.sum())
        m.num_episodes_ongoing = int((keep & ~is_done).sum())
        if fin.any():
            rets, lens = seg_return[fin], (t_started + seg_len)[fin]
            m.episode_return_mean, m.episode_return_min, m.episode_return_max = float(rets.mean()), float(rets.min()), float(rets.max())
            m.episode_len_mean, m.episode_len_min, m.episode_len_max = float(lens.mean()), float(lens.min()), float(lens.max())
        return cols, seg, m

    def _episode_id(self, env: int, count: int) -> str:
        return f"{self._run_id}{self._resets:04x}{env:06x}{count:08x}"

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
        ids = np.array([self._episode_id(a, c) for a, c in zip(seg["env"].tolist(), seg["count"].tolist())] or [""])
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
            data[SampleBatch.INFOS] = _unflatten({k: _info_for_obs(col, e, j) for k, col in info_cols})
        else:
            data[SampleBatch.INFOS] = [{}] * n_rows
        for name, col in cols.items():
            if name.startswith("extra:"):
                data[name[6:]] = col[e, j]
        return MultiAgentBatch({DEFAULT_POLICY_ID: SampleBatch(data)}, n_rows), m

    # ------------------------------------------------------------------------- multi-agent

    def _agent_steps(self, chunks: list[Trajectory], num_episodes: int | None, by_policy: bool = False):
        """Segments plus the completed agent steps of the call, rows in output order
        (``by_policy``: grouped by policy first, so each policy's rows are one slice)."""
        cols, seg, m = self._segments(chunks, num_episodes)
        H, E = self._col_horizon, self.num_envs
        call = {k: (v if k.startswith("info:") else v[:, :, H:] if k == "obs" else v[:, H:]) for k, v in cols.items()}
        old = self._carry or AgentCarry.empty(call, E, self.env.num_agents)
        steps, self._carry = agent_steps(call, old, np.asarray(chunks[0].episode_step_0), self._next_acting)
        # Each step belongs to the segment of its first call step (the carried ones: step 0).
        L = call["is_reset"].shape[1]
        seg_of_step = np.full((E, L), -1, np.int64)
        lens = seg["len"]
        offset = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
        seg_of_step[np.repeat(seg["env"], lens), np.repeat(seg["start"], lens) + offset] = np.repeat(np.arange(len(lens)), lens)
        pos = seg_of_step[steps.env, np.maximum(steps.slot - 1, 0)]
        # One int64 sort key: (policy rank,) segment, agent, t.
        A = len(self.agent_ids)
        key = (pos + 1) * A + steps.agent
        if by_policy:  # policies in order of first appearance on the agent axis
            pids = list(dict.fromkeys(self.agent_policy))
            rank = np.array([pids.index(pid) for pid in self.agent_policy])[steps.agent]
            key = rank * ((len(seg["env"]) + 1) * A) + key
        t_span = int(steps.t.max()) + 1 if len(steps.t) else 1
        order = np.argsort(key * t_span + steps.t, kind="stable")
        order = order[pos[order] >= 0]
        steps = AgentSteps(**{f.name: getattr(steps, f.name)[order] for f in dataclasses.fields(AgentSteps)})
        return call, cols, seg, m, steps, pos[order], old

    def _step_columns(self, call: dict[str, Any], cols: dict[str, Any], steps: AgentSteps, old: AgentCarry,
                      eps_ids: np.ndarray, next_infos: bool = False) -> dict[str, Any]:
        e, s, a, c = steps.env, steps.slot, steps.agent, steps.end
        A, H = self.env.num_agents, self._col_horizon
        # Observations are the bulk of the data: the columns keep them agent-major, so the
        # rows (agent by agent, in time) gather nearly sequentially; and a row's new_obs is
        # the next row's obs except where an agent's run of rows ends.
        obs = take(cols["obs"], old.obs, e, s, a, H, agent_major=True)
        new_obs = np.empty_like(obs)
        same = np.zeros(len(e), bool)
        if len(e) > 1:
            same[:-1] = (e[1:] == e[:-1]) & (a[1:] == a[:-1]) & (s[1:] == c[:-1])
            new_obs[:-1] = obs[1:]  # one sequential copy; the other rows are gathered below
        rest = np.flatnonzero(~same)
        new_obs[rest] = take(cols["obs"], old.obs, e[rest], c[rest], a[rest], H, agent_major=True)
        data: dict[str, Any] = {
            SampleBatch.OBS: obs,
            SampleBatch.NEXT_OBS: new_obs,
            SampleBatch.ACTIONS: take(cols["actions"], old.action, e, s, a, H),
            SampleBatch.REWARDS: steps.reward.astype(np.float32),
            SampleBatch.TERMINATEDS: steps.terminated,
            SampleBatch.TRUNCATEDS: steps.truncated,
            SampleBatch.T: steps.t.astype(np.int64),
            SampleBatch.EPS_ID: eps_ids,
            SampleBatch.AGENT_INDEX: a.astype(np.int64),
        }
        info_keys = [k for k in call if k.startswith("info:")]
        data[SampleBatch.INFOS] = (
            _unflatten({k[5:]: take_info(call[k], old.info[k], e, s, a, A) for k in info_keys}) if info_keys
            else [{}] * len(e)
        )
        if next_infos and info_keys:
            data["_next_infos"] = _unflatten({k[5:]: take_info(call[k], old.info[k], e, c, a, A) for k in info_keys})
        for k in call:
            if k.startswith("extra:"):
                data[k[6:]] = take(cols[k], old.extras[k[6:]], e, s, a, H)
        return data

    def _agent_episode_id(self, ma_id: str, agent: int) -> str:
        return f"{ma_id}{agent:04x}"

    def _to_ma_batch(self, chunks: list[Trajectory], num_episodes: int | None):
        """``MultiAgentBatch``: one row per completed agent step, keyed by policy id; rows
        episode by episode (``sample()``'s order), then agent by agent, then by ``t``."""
        call, cols, seg, m, steps, pos, old = self._agent_steps(chunks, num_episodes, by_policy=True)
        self._open = {}  # open sample() chunks are stale now: the next sample() starts new chunks
        # eps_id: one string per (episode, agent) run of rows, then broadcast to the rows.
        n = len(pos)
        uid = pos * len(self.agent_ids) + steps.agent
        new_run = np.empty(n, bool)
        new_run[:1] = True
        np.not_equal(uid[1:], uid[:-1], out=new_run[1:])
        starts = np.flatnonzero(new_run)
        ids = [self._agent_episode_id(self._episode_id(int(seg["env"][p]), int(seg["count"][p])), int(a))
               for p, a in zip(pos[starts].tolist(), steps.agent[starts].tolist())]
        # An object array of shared strings: 8 bytes per row (a unicode array would be 144).
        sa_ids = np.array(ids or [""], dtype=object)[np.cumsum(new_run) - 1]
        data = self._step_columns(call, cols, steps, old, sa_ids)
        # Rows are grouped by policy: each policy's batch is one slice (numpy views).
        pids = list(dict.fromkeys(self.agent_policy))
        rank = np.array([pids.index(pid) for pid in self.agent_policy])[steps.agent]
        bounds = np.searchsorted(rank, np.arange(len(pids) + 1))
        batches = {pid: SampleBatch(_slice_rows(data, int(bounds[i]), int(bounds[i + 1]))) for i, pid in enumerate(pids)}
        m.num_agent_steps_sampled = n
        return MultiAgentBatch(batches, m.num_env_steps_sampled), m

    def _to_ma_episodes(self, chunks: list[Trajectory], num_episodes: int | None):
        call, cols, seg, m, steps, pos, old = self._agent_steps(chunks, num_episodes)
        n_seg = len(seg["env"])
        data = self._step_columns(call, cols, steps, old, np.zeros(len(pos), np.int8), next_infos=True)
        bounds = np.searchsorted(pos, np.arange(n_seg + 1))
        step0 = np.asarray(chunks[0].episode_step_0)
        episodes, still_open = [], {}
        with _no_gc():
            for i in range(n_seg):
                e, start, length = int(seg["env"][i]), int(seg["start"][i]), int(seg["len"][i])
                continues = start == 0 and step0[e] > 0
                ep = self._open_episode(e, int(seg["count"][i]), continues, int(step0[e]), old)
                rows = np.arange(bounds[i], bounds[i + 1])
                done = bool(seg["term"][i] or seg["trunc"][i])
                self._extend_episode(ep, e, length, rows, steps, data, not done and start + length == call["is_reset"].shape[1], call)
                if done:
                    ep.is_terminated, ep.is_truncated = True, bool(seg["trunc"][i])
                else:
                    still_open[e] = ep
                episodes.append(ep)
        self._open = still_open
        m.num_agent_steps_sampled = len(pos)
        return episodes, m

    def _open_episode(self, e: int, count: int, continues: bool, step0: int, old: AgentCarry) -> MultiAgentEpisode:
        """The chunk that the call's steps of env ``e`` extend: the successor (``cut``) of
        the open chunk, or a new episode (also when the previous call was ``sample_batch``)."""
        if continues and e in self._open:
            ep = self._open[e].cut(self.horizon)
            for sa in ep.agent_episodes.values():  # env infos stay numpy'ized, as in new chunks
                if not sa.infos.finalized and sa.infos.data and sa.infos.data[0]:
                    sa.infos.data, sa.infos.finalized = batch(sa.infos.data), True
            return ep
        ma_id = self._episode_id(e, count)
        mapping = dict(zip(self.agent_ids, self.agent_policy))
        ep = MultiAgentEpisode(
            ma_id,
            observation_space={a: self._obs_space for a in self.agent_ids},
            action_space={a: self._act_space for a in self.agent_ids},
            agent_episode_ids={a: self._agent_episode_id(ma_id, i) for i, a in enumerate(self.agent_ids)},
            agent_module_ids=mapping,
            agent_to_module_mapping_fn=lambda aid, episode: mapping[aid],
        )
        ep._first_step = 0  # env step of the first map entry still to be written
        if continues:  # no chunk to cut: start at the earliest hanging step's observation
            hanging = old.start[e][old.pend[e]]
            first = int(min([step0, *hanging.tolist()]))
            ep.env_t_started = ep.env_t = step0
            ep._len_lookback_buffers = step0 - first
            ep._first_step = first
            for a in np.nonzero(old.pend[e])[0].tolist():
                self._ensure_agent(ep, a, old.obs[e, a], {k[5:]: v[e, a] for k, v in old.info.items()},
                                   int(old.n_act[e, a]) - 1)
                aid = self.agent_ids[a]
                ep._hanging_actions_end[aid] = old.action[e, a]
                ep._hanging_rewards_end[aid] = float(old.reward[e, a])
                ep._hanging_extra_model_outputs_end[aid] = {k: v[e, a] for k, v in old.extras.items()}
        return ep

    def _ensure_agent(self, ep: MultiAgentEpisode, a: int, obs: Any, info: dict, t_started: int) -> SingleAgentEpisode:
        aid = self.agent_ids[a]
        sa = ep.agent_episodes.get(aid)
        if sa is not None:
            return sa
        sa = SingleAgentEpisode.__new__(SingleAgentEpisode)
        sa.id_ = ep._agent_episode_ids.setdefault(aid, self._agent_episode_id(ep.id_, a))
        sa.agent_id, sa.module_id, sa.multi_agent_episode_id = aid, ep.module_for(aid), ep.id_
        sa._observation_space, sa._action_space = self._obs_space, self._act_space
        sa.observations = _fast_buffer(np.asarray(obs)[None], 0, self._obs_space)
        sa.infos = _fast_buffer(_unflatten({k: np.asarray(v)[None] for k, v in info.items()}) if info else [{}], 0)
        sa.actions = _fast_buffer(np.zeros((0,) + self._act_zero.shape, self._act_zero.dtype), 0, self._act_space)
        sa.rewards = _fast_buffer(np.zeros((0,), np.float32), 0, _reward_space())
        sa.extra_model_outputs = {}
        sa.is_terminated = sa.is_truncated = False
        sa.t_started = sa.t = t_started
        sa.custom_data = {}
        sa._start_time = sa._last_step_time = None
        ep.agent_episodes[aid] = sa
        ep.agent_t_started[aid] = t_started
        return sa

    def _extend_episode(self, ep: MultiAgentEpisode, e: int, length: int, rows: np.ndarray, steps: AgentSteps,
                        data: dict[str, Any], hanging: bool, call: dict[str, Any]) -> None:
        """Appends ``length`` env steps of env ``e`` (agent steps ``rows``) to ``ep``."""
        first = getattr(ep, "_first_step", None)
        if first is None:  # a cut successor: its maps end at env step ep.env_t
            first = ep.env_t + 1
        else:
            del ep._first_step
        last = ep.env_t + length if ep.env_t_to_agent_t or ep.env_t_started or ep.env_t else length
        if not ep.env_t_to_agent_t and ep.env_t == 0 and ep.env_t_started == 0:
            last = length  # a new episode: env steps 0 .. length
        width = last - first + 1
        info_keys = [k for k in data[SampleBatch.INFOS]] if isinstance(data[SampleBatch.INFOS], dict) else []
        extra_keys = [k for k in data if k not in _STEP_KEYS]
        agent_of_row = steps.agent[rows]
        carry = self._carry
        for a, aid in enumerate(self.agent_ids):
            r = rows[agent_of_row == a]
            pend = hanging and bool(carry.pend[e, a])
            m = ep.env_t_to_agent_t.get(aid)
            entries = np.full(width, -1, np.int64)
            if len(r):
                sa = self._ensure_agent(ep, a, data[SampleBatch.OBS][r[0]], _row_info(data, info_keys, r[0]),
                                        int(steps.t[r[0]]))
                inside = steps.start_step[r] >= first  # earlier starts are already mapped
                entries[steps.start_step[r][inside] - first] = steps.t[r][inside]
                entries[steps.end_step[r] - first] = steps.t[r] + 1
                _extend(sa.observations, data[SampleBatch.NEXT_OBS][r])
                _extend(sa.actions, data[SampleBatch.ACTIONS][r])
                _extend(sa.rewards, data[SampleBatch.REWARDS][r])
                for k in extra_keys:
                    if k not in sa.extra_model_outputs:
                        sa.extra_model_outputs[k] = _fast_buffer(data[k][r][:0], sa.actions.lookback)
                    _extend(sa.extra_model_outputs[k], data[k][r])
                if info_keys and sa.infos.finalized:
                    _extend(sa.infos, _take_rows(data["_next_infos"], r))
                elif info_keys:  # a list-mode column (a cut successor): one dict per row
                    rows_info = _take_rows(data["_next_infos"], r)
                    sa.infos.data.extend(tree_map(lambda x, i=i: x[i], rows_info) for i in range(len(r)))
                else:
                    sa.infos.data.extend([{}] * len(r))
                sa.t += len(r)
                sa.is_terminated, sa.is_truncated = bool(steps.terminated[r[-1]]), bool(steps.truncated[r[-1]])
                for cache in (ep._hanging_actions_end, ep._hanging_rewards_end, ep._hanging_extra_model_outputs_end):
                    cache.pop(aid, None)
            if pend:
                start = int(carry.start[e, a])
                t = int(carry.n_act[e, a]) - 1
                self._ensure_agent(ep, a, carry.obs[e, a], {k[5:]: v[e, a] for k, v in carry.info.items()}, t)
                if first <= start <= last:
                    entries[start - first] = t
                ep._hanging_actions_end[aid] = carry.action[e, a]
                ep._hanging_rewards_end[aid] = float(carry.reward[e, a])
                ep._hanging_extra_model_outputs_end[aid] = {k: v[e, a] for k, v in carry.extras.items()}
            if hanging and aid not in ep.agent_episodes and self._next_acting[e, a]:
                # Joins with the call's last observation (it acts on it in the next call).
                L = call["is_reset"].shape[1]
                info = {k[5:]: take_info(call[k], carry.info[k], np.array([e]), np.array([L + 1]), np.array([a]),
                                         len(self.agent_ids))[0] for k in call if k.startswith("info:")}
                self._ensure_agent(ep, a, call["obs"][e, a, L], info, int(carry.n_act[e, a]))
                entries[last - first] = int(carry.n_act[e, a])
            if m is None and aid not in ep.agent_episodes:
                continue
            values = [SKIP if v < 0 else v for v in entries.tolist()]
            if m is None:
                pad = first - (ep.env_t_started - ep._len_lookback_buffers)
                ep.env_t_to_agent_t[aid] = InfiniteLookbackBuffer([SKIP] * pad + values, ep._len_lookback_buffers)
            else:
                m.data.extend(values)
        ep.env_t = last

    def _episode(self, cols: dict[str, Any], extra_cols: list, info_cols: list, e: int, start: int, length: int, lb: int,
                 t_started: int, term: bool, trunc: bool, count: int) -> SingleAgentEpisode:
        H = self.horizon
        a, b = H + start - lb, H + start + length  # step range incl. lookback
        ep = SingleAgentEpisode.__new__(SingleAgentEpisode)
        ep.id_ = self._episode_id(e, count)
        ep.agent_id = ep.module_id = ep.multi_agent_episode_id = None
        ep._observation_space, ep._action_space = self._obs_space, self._act_space
        ep.observations = _fast_buffer(cols["obs"][e, a : b + 1], lb, self._obs_space)
        if info_cols:
            # Env infos come with the step that produced each observation: the info of
            # observation j + 1 was recorded at step j (the first observation's is zeros).
            slots = np.arange(a, b + 1)
            ep.infos = _fast_buffer(_unflatten({k: _info_for_obs(col, e, slots) for k, col in info_cols}), lb)
        else:
            ep.infos = _fast_buffer([{}] * (length + lb + 1), lb)
        ep.actions = _fast_buffer(cols["actions"][e, a:b], lb, self._act_space)
        ep.rewards = _fast_buffer(cols["rewards"][e, a:b], lb, _reward_space())
        ep.extra_model_outputs = {name: _fast_buffer(col[e, a:b], lb) for name, col in extra_cols}
        ep.is_terminated, ep.is_truncated = term, trunc
        ep.t_started, ep.t = t_started, t_started + length
        ep.custom_data = {}
        ep._start_time = ep._last_step_time = None
        return ep


@contextlib.contextmanager
def _no_gc():
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


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


def _unflatten(flat: dict[str, np.ndarray]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for path, v in flat.items():
        node = tree
        *parents, last = path.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = v
    return tree


_STEP_KEYS = frozenset({
    SampleBatch.OBS, SampleBatch.NEXT_OBS, SampleBatch.ACTIONS, SampleBatch.REWARDS, SampleBatch.TERMINATEDS,
    SampleBatch.TRUNCATEDS, SampleBatch.T, SampleBatch.EPS_ID, SampleBatch.AGENT_INDEX, SampleBatch.INFOS,
    "_next_infos",
})


def _slice_rows(data: dict[str, Any], lo: int, hi: int) -> dict[str, Any]:
    return {k: (_slice_rows(v, lo, hi) if isinstance(v, dict) else v[lo:hi]) for k, v in data.items() if k != "_next_infos"}


def _take_rows(data: dict[str, Any], rows: np.ndarray) -> dict[str, Any]:
    out = {}
    for k, v in data.items():
        if isinstance(v, dict):
            out[k] = _take_rows(v, rows)
        elif isinstance(v, list):
            out[k] = [v[i] for i in rows.tolist()]
        else:
            out[k] = v[rows]
    return out


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, np.ndarray]:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flatten(v, prefix + k + "/"))
        else:
            out[prefix + k] = v
    return out


def _row_info(data: dict[str, Any], info_keys: list, row: int) -> dict[str, Any]:
    """Flattened info leaves of the start observation of step ``row``."""
    if not info_keys:
        return {}
    return {k: v[row] for k, v in _flatten(data[SampleBatch.INFOS]).items()}


def _extend(buf: InfiniteLookbackBuffer, items: Any) -> None:
    """Appends arrays to a numpy'ized buffer (an empty list-mode buffer becomes numpy'ized)."""
    if not buf.finalized and buf.len_incl_lookback() == 0:
        buf.data, buf.finalized = items, True
        return
    buf.extend(items)
