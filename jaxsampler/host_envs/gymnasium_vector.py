"""Gymnasium's own vector envs (``SyncVectorEnv``, ``AsyncVectorEnv``) as a ``HostEnv``.

``AsyncVectorEnv`` steps its sub-envs in worker processes, so slow Python simulators run
in parallel while the policy still runs as one jitted, batched call. The vector env must
use Gymnasium's ``AutoresetMode.NEXT_STEP`` (the default): the step after an episode
ends returns the new episode's first observation (reward 0, action ignored), which is
exactly :mod:`jaxsampler.host_envs.base`'s next-step contract. Vector envs step in
lockstep, so every poll delivers every sub-env; sub-envs that reset take a placeholder
action that Gymnasium ignores. Create ``AsyncVectorEnv(..., context="spawn")`` (or
``"forkserver"``): forking a process in which JAX threads run can deadlock.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxsampler.constants import ALL_AGENTS, DEFAULT_AGENT_ID
from jaxsampler.host_envs.base import HostEnv, MultiEnvDict, PollResult

__all__ = ["GymnasiumVectorHostEnv"]


def _item(tree: Any, i: int) -> Any:
    if isinstance(tree, dict):
        return {k: _item(v, i) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_item(v, i) for v in tree)
    return tree[i]


def _infos_of(infos: dict, i: int) -> dict:
    """Sub-env ``i``'s info from Gymnasium's vectorised info dict (``k`` / ``_k`` masks)."""
    out = {}
    for k, v in (infos or {}).items():
        if k.startswith("_"):
            continue
        mask = infos.get("_" + k)
        if mask is not None and not bool(np.asarray(mask)[i]):
            continue
        out[k] = _infos_of(v, i) if isinstance(v, dict) else v[i]
    return out


class GymnasiumVectorHostEnv(HostEnv):
    """A ``gymnasium.vector.VectorEnv`` as a :class:`HostEnv` (single agent).

    Args:
        vector_env: a Gymnasium vector env with ``AutoresetMode.NEXT_STEP``.
        seed: the first reset's seed (sub-env ``i`` gets ``seed + i``, Gymnasium's rule).

    Raises:
        ValueError: another auto-reset mode; spaces with no jaxsampler equivalent.
    """

    def __init__(self, vector_env: Any, *, seed: int | None = 0):
        import gymnasium

        from jaxsampler.spaces import from_gymnasium_space

        mode = vector_env.metadata.get("autoreset_mode", gymnasium.vector.AutoresetMode.NEXT_STEP)
        if str(getattr(mode, "value", mode)) != gymnasium.vector.AutoresetMode.NEXT_STEP.value:
            raise ValueError(
                f"the vector env uses autoreset mode {mode!r}; jaxsampler needs "
                "AutoresetMode.NEXT_STEP "
                "(the default; pass autoreset_mode=gymnasium.vector.AutoresetMode.NEXT_STEP)"
            )
        self._vec, self._seed = vector_env, seed
        self.num_envs = int(vector_env.num_envs)
        self.agent_ids = (DEFAULT_AGENT_ID,)
        self._gym_action_space = vector_env.single_action_space
        self.observation_space = from_gymnasium_space(vector_env.single_observation_space)
        self.action_space = from_gymnasium_space(vector_env.single_action_space)
        self._started = False
        self._resetting = np.zeros(self.num_envs, bool)  # done last step: this step resets
        self._awaiting: set[int] = set()
        self._actions: dict[int, Any] = {}
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def reset(self) -> None:
        """Drops every running episode: the next poll resets all sub-envs."""
        self._started = False
        self._awaiting.clear()
        self._actions.clear()

    def poll(self, timeout: float | None = None) -> PollResult:
        """Steps every sub-env at once (``timeout`` is ignored: the vector env is always ready)."""
        a = DEFAULT_AGENT_ID
        out = PollResult({}, {}, {}, {}, {}, {})
        if not self._started:
            obs, infos = self._vec.reset(seed=self._seed)
            self._seed = None  # later resets continue each sub-env's RNG
            self._started, self._resetting[:] = True, False
            for i in range(self.num_envs):
                out.obs[i] = {a: _item(obs, i)}
                out.infos[i] = {a: _infos_of(infos, i)}
                out.terminateds[i], out.truncateds[i] = {ALL_AGENTS: False}, {ALL_AGENTS: False}
            self._awaiting = set(range(self.num_envs))
            return out
        if self._awaiting:
            raise RuntimeError(
                f"poll(): answer sub-envs {sorted(self._awaiting)} with send_actions() first"
            )
        actions = [
            self._actions[i] if i in self._actions else self._gym_action_space.sample()
            for i in range(self.num_envs)
        ]
        self._actions.clear()
        batched = np.stack([np.asarray(x) for x in actions])
        obs, rewards, terms, truncs, infos = self._vec.step(batched)
        was_resetting = self._resetting.copy()
        for i in range(self.num_envs):
            out.obs[i] = {a: _item(obs, i)}
            out.infos[i] = {a: _infos_of(infos, i)}
            if was_resetting[i]:  # the new episode's first observation
                out.terminateds[i], out.truncateds[i] = {ALL_AGENTS: False}, {ALL_AGENTS: False}
                self._resetting[i] = False
                self._awaiting.add(i)
                continue
            term, trunc = bool(terms[i]), bool(truncs[i])
            out.rewards[i] = {a: float(rewards[i])}
            out.terminateds[i], out.truncateds[i] = (
                {a: term, ALL_AGENTS: term},
                {a: trunc, ALL_AGENTS: trunc},
            )
            if term or trunc:
                self._resetting[i] = True
            else:
                self._awaiting.add(i)
        return out

    def send_actions(self, actions: MultiEnvDict) -> None:
        """Answers the sub-envs of the last poll (all of those not done)."""
        a = DEFAULT_AGENT_ID
        for env_id, per_agent in actions.items():
            if env_id not in self._awaiting:
                raise KeyError(f"send_actions: env {env_id!r} is not waiting for an action")
            if not isinstance(per_agent, dict) or set(per_agent) != {a}:
                raise ValueError(
                    f"send_actions: env {env_id!r} needs an action for {a!r}, got {per_agent!r}"
                )
            action = np.asarray(per_agent[a])
            if not self._gym_action_space.contains(action.astype(self._gym_action_space.dtype)):
                raise ValueError(
                    f"send_actions: env {env_id!r}: {per_agent[a]!r} is not in "
                    f"{self._gym_action_space}"
                )
            self._actions[env_id] = action
        self._awaiting -= set(actions)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._vec.close()
