"""Transforms on a host-stepped env: the device rollout's transforms, poll by poll.

:class:`HostTransforms` runs a bound :class:`~jaxsampler.transforms.Pipeline` on the
observations and rewards of each poll of a :class:`~jaxsampler.sampling.host.HostSampler`,
with the same functions and the same semantics as the device rollout:

* the rows of one call are the ``(env, agent)`` pairs the poll has an observation of
  (plus those it has only a reward of, for agents whose episode already started:
  ``recorded`` false and a zero observation, so a reward transform sees every reward),
  stacked to ``[N, 1, ...]`` (the transforms' ``[E, A, ...]`` with one agent per row)
  and zero-padded to a bucket size (one compilation per bucket; padded rows are not
  recorded); more rows than the largest bucket are split into several calls;
* ``Observed.recorded``: every observation the poll delivers (a host env delivers an
  agent's observation when it acts on it or when it is its final one); ``first``: the
  agent's first observation of its episode; ``reward`` and the done flags (the agent's
  own OR ``"__all__"``) from the poll; ``action``: the agent's previous action, policy
  side (zeros with a first observation); ``info``: ``None``;
* each observation's info gets the env's own observation and reward
  (``info["raw_obs"]``, ``info["raw_reward"]``, where a transform changes them), for
  debugging (a dict merge per agent step, about 0.3 us);
* ``shared`` state (e.g. normalization statistics) is one global pytree, kept on the
  device and carried across calls and resets; ``rows`` state is kept per
  ``(env id, agent id)`` on the host (like recurrent policy states) from the agent's
  first observation to the end of its env's episode, and dropped then or at a reset.

Host envs have no env params, so transforms that draw them (domain randomization) are
refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxsampler.constants import ALL_AGENTS
from jaxsampler.episodes.lookback import batch as stack
from jaxsampler.host_envs.base import PollResult
from jaxsampler.sampling.host.feeds import episode_over
from jaxsampler.transforms.base import Context, Observed, Pipeline, StageState, TransformState

__all__ = ["HostTransforms"]

#: One row of a poll: ``(env id, agent id, observation or None)``.
_Row = tuple[Any, Any, Any]


class HostTransforms:
    """The transforms of a host sampler (see the module docstring).

    Args:
        pipeline: the transforms bound to the host env's (one agent's) spaces.
        batch_sizes: the padded batch sizes (sorted), as the sampler's policy calls use.

    Raises:
        ValueError: a transform draws env params (host envs have none).
    """

    def __init__(self, pipeline: Pipeline, batch_sizes: Sequence[int]):
        if pipeline.randomizes_params:
            names = [type(t).__name__ for t in pipeline.transforms if t.randomizes_params]
            raise ValueError(
                f"{', '.join(names)} draws env params at resets, which host-stepped envs do "
                "not have; randomize a host env's physics in the env itself, or use a "
                "pure-JAX env"
            )
        self.pipeline = pipeline
        self.batch_sizes = tuple(batch_sizes)
        state = pipeline.init((1, 1))
        assert state is not None
        #: the transforms' ``shared`` state, one entry per transform (device arrays)
        self.shared: tuple[Any, ...] = tuple(st.shared for st in state.stages)
        self._init_rows = jax.device_get(tuple(st.rows for st in state.stages))
        self._has_rows = bool(jax.tree.leaves(self._init_rows))
        #: ``(env id, agent id)`` -> the rows state (leaves ``[1, 1, ...]``); only for
        #: transforms with rows state
        self.rows: dict[tuple[Any, Any], Any] = {}
        self._started: dict[Any, set[Any]] = {}  # env id -> agents whose episode has begun
        space = pipeline.spaces[0].obs if pipeline.spaces else pipeline.observation_space
        self._obs_zero = jax.device_get(space.zeros())
        self._act_zero = jax.device_get(pipeline.action_space.zeros())
        self._fn = jax.jit(self._observe)

    def _observe(
        self, shared: tuple[Any, ...], rows: tuple[Any, ...], step: Observed
    ) -> tuple[tuple[Any, ...], tuple[Any, ...], Any, jax.Array]:
        stages = tuple(StageState(s, r) for s, r in zip(shared, rows))
        state = TransformState(stages, jnp.zeros(step.recorded.shape, jnp.bool_))
        state, seen = self.pipeline.observe(state, step, Context())
        return (
            tuple(st.shared for st in state.stages),
            tuple(st.rows for st in state.stages),
            seen.obs,
            seen.reward,
        )

    def reset(self) -> None:
        """Forgets every running episode's rows; the shared state is kept."""
        self.rows.clear()
        self._started.clear()

    def apply(
        self,
        res: PollResult,
        obs: dict[Any, dict[Any, Any]],
        sent: dict[Any, dict[Any, tuple[Any, Any]]],
    ) -> tuple[PollResult, dict[Any, dict[Any, Any]]]:
        """The poll as the policy sees it: ``(poll with transformed rewards, transformed
        observations)``; ``obs`` are the poll's checked observations, ``sent`` the
        (policy-side) actions awaiting this poll, ``env id -> agent id -> (action, ...)``."""
        rows: list[_Row] = []
        for e, per_agent in obs.items():
            rows += [(e, a, o) for a, o in per_agent.items()]
        for e, rewards in res.rewards.items():
            seen = obs.get(e, {})
            rows += [
                (e, a, None)
                for a in rewards
                if a != ALL_AGENTS and a not in seen and a in self._started.get(e, ())
            ]
        new_obs: dict[Any, dict[Any, Any]] = {e: {} for e in obs}
        new_rewards = {e: dict(r) for e, r in res.rewards.items()}
        top = self.batch_sizes[-1]
        for lo in range(0, len(rows), top):
            self._apply_rows(res, rows[lo : lo + top], sent, new_obs, new_rewards)
        for e in set(res.terminateds) | set(res.truncateds):
            if episode_over(res, e):
                self._forget_env(e)
        return res._replace(rewards=new_rewards, infos=self._raw_infos(res, obs)), new_obs

    def _raw_infos(self, res: PollResult, obs: dict[Any, dict[Any, Any]]) -> Any:
        """The poll's infos with the env's own observation (``"raw_obs"``, if a transform
        changes observations) and reward (``"raw_reward"``, if one changes rewards) added
        to the info of every observation (an entry the env's info has already is kept)."""
        pipe = self.pipeline
        if not (pipe.changes_obs or pipe.changes_reward):
            return res.infos
        infos = {e: dict(per) for e, per in res.infos.items()}
        for e, per_agent in obs.items():
            env_infos = infos.setdefault(e, {})
            rewards = res.rewards.get(e, {})
            for a, o in per_agent.items():
                extra: dict[str, Any] = {}
                if pipe.changes_obs:
                    extra["raw_obs"] = o
                if pipe.changes_reward:
                    extra["raw_reward"] = float(rewards.get(a, 0.0))
                env_infos[a] = {**extra, **(env_infos.get(a) or {})}
        return infos

    def _forget_env(self, e: Any) -> None:
        for a in self._started.pop(e, ()):
            self.rows.pop((e, a), None)

    def _apply_rows(
        self,
        res: PollResult,
        rows: list[_Row],
        sent: dict[Any, dict[Any, tuple[Any, Any]]],
        new_obs: dict[Any, dict[Any, Any]],
        new_rewards: dict[Any, dict[Any, Any]],
    ) -> None:
        n = len(rows)
        b = bucket(n, self.batch_sizes)
        pad = b - n
        first = np.zeros((b, 1), bool)
        recorded = np.zeros((b, 1), bool)
        reward = np.zeros((b, 1), np.float32)
        term = np.zeros((b, 1), bool)
        trunc = np.zeros((b, 1), bool)
        obs_list, act_list = [], []
        for i, (e, a, o) in enumerate(rows):
            recorded[i, 0] = o is not None
            first[i, 0] = o is not None and a not in self._started.get(e, ())
            reward[i, 0] = float(res.rewards.get(e, {}).get(a, 0.0))
            terms, truncs = res.terminateds.get(e, {}), res.truncateds.get(e, {})
            term[i, 0] = bool(terms.get(a, False) or terms.get(ALL_AGENTS, False))
            trunc[i, 0] = bool(truncs.get(a, False) or truncs.get(ALL_AGENTS, False))
            obs_list.append(self._obs_zero if o is None else o)
            prev = sent.get(e, {}).get(a)
            act_list.append(self._act_zero if prev is None or first[i, 0] else prev[0])
        obs_list += [self._obs_zero] * pad
        act_list += [self._act_zero] * pad
        fields: dict[str, Any] = {  # numpy leaves: the jitted call transfers them
            "reward": reward,
            "terminated": term,
            "truncated": trunc,
            "recorded": recorded,
            "first": first,
        }
        step = Observed(obs=_rows(obs_list), action=_rows(act_list), **fields)
        if self._has_rows:
            init = self._init_rows
            per_row = [self.rows.get((e, a), init) for e, a, _ in rows] + [init] * pad
            row_state = jax.tree.map(lambda *xs: np.concatenate(xs), *per_row)
        else:
            row_state = self._init_rows
        self.shared, row_state, seen_obs, seen_reward = self._fn(self.shared, row_state, step)
        seen_obs, seen_reward, row_state = jax.device_get((seen_obs, seen_reward, row_state))
        plain = isinstance(seen_obs, np.ndarray)
        for i, (e, a, o) in enumerate(rows):
            if o is not None:
                self._started.setdefault(e, set()).add(a)
                new_obs[e][a] = (
                    seen_obs[i, 0] if plain else jax.tree.map(lambda x, i=i: x[i, 0], seen_obs)
                )
            if a in new_rewards.get(e, {}) or o is not None:
                new_rewards.setdefault(e, {})[a] = float(seen_reward[i, 0])
            if self._has_rows:
                self.rows[(e, a)] = jax.tree.map(lambda x, i=i: x[i : i + 1], row_state)


def bucket(n: int, batch_sizes: Sequence[int]) -> int:
    """The padded size of a call of ``n`` rows: the smallest of the (sorted) ``batch_sizes``
    that holds them, else the largest (the caller splits larger batches)."""
    for b in batch_sizes:
        if b >= n:
            return b
    return batch_sizes[-1]


def _rows(items: list[Any]) -> Any:
    """``[N, 1, ...]`` leaves of a list of per-row pytrees."""
    return jax.tree.map(lambda x: x[:, None], stack(items))
