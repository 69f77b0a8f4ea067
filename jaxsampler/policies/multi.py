"""Several policies, one jitted step: ``MultiAgentPolicy`` maps agents to policies.

::

    policy = js.policies.MultiAgentPolicy(
        env,
        {"red": MLPPolicy(...), "blue": MLPPolicy(...)},
        policy_mapping_fn=lambda agent_id, episode, **kwargs: (
            "red" if agent_id in ("agent_0", "agent_1") else "blue"
        ),
    )
    params = policy.init(key)            # {"red": red_params, "blue": blue_params}

``policy_mapping_fn`` takes RLlib's signature, ``(agent_id, episode, **kwargs) ->
policy_id``, or just ``(agent_id) -> policy_id``. The mapping is static: it is called
once per agent at construction (with ``episode=None``, as there is no episode yet), so
each policy owns a fixed set of agent-axis slots; a mapping that depends on the episode
cannot be expressed. Inside the step every
policy is evaluated on exactly its own agents (a static slice or gather of the agent
axis, ``[E, A_p, ...]``), never on the others', and the outputs are put back in agent
order with one static permutation. The result is itself a :class:`Policy`, so
``make_rollout`` / ``Sampler`` take it like any other.

Rules:

* in an env without agent groups, every policy must be built for the env's (one-agent)
  observation and action space, or for the spaces its transforms hand the policy
  (``transforms=``, the tuple given to ``make_rollout``; or pass the agent ids,
  ``env.agent_ids``, instead of the env: then the spaces are checked when the rollout is
  built);
* in an env with agent groups (``env.agent_layout``, :mod:`jaxsampler.envs.groups`; pass
  the env, not its agent ids), the agent axis carries every agent in the *carrier*
  spaces, and each policy plays either

  - **one group**: all its agents lie in that group and it is built for the group's own
    spaces (e.g. ``MLPPolicy(group.observation_space, group.action_space)``). Inside the
    step its rows are unpacked to the group's observations (``layout.unpack_obs``) and
    its actions packed back into the carrier (``layout.pack_action``), so a
    ``Discrete(5)`` group never draws action 7 of a ``Discrete(9)`` carrier; or
  - **padded rows**: it is built for the carrier spaces (``env.observation_space``,
    ``env.action_space``) and plays its agents' rows as they are, from any groups (one
    policy for every agent is this mode).

  A policy whose agents span groups and is not built for the carrier, or that is built
  neither for its group's spaces nor for the carrier's, is refused at construction, the
  policy, agents, groups and spaces named. :attr:`policy_groups` says which mode each
  policy got. Transforms that change the observation or action space (``FrameStack``,
  ``ActionMaskFromInfo``, ``PrevActionsRewards``, ``RescaleActions``) are refused for
  such an env, here (``transforms=``) and when the rollout is built, since the rows
  would no longer have the carrier's layout; transforms that keep both spaces (reward
  transforms; ``NormalizeObservation``, which then normalizes each carrier column over
  all groups' agents together, when every group's observations are in the carrier's
  dtype (an integer group's would be cast back to integers on unpacking: refused);
  ``ClipActions``, to the carrier's bounds, the widest over the groups, so a group's own
  bounds are the env's to clip) run as usual;
* masked observations (``Dict(observations=..., action_mask=...)``) pass through: each
  policy gets its own agents' rows of both entries, so it masks with its agents' masks;
* the extras of all policies are merged by key; a key that some policy does not produce
  is zero for its agents. Shapes beyond ``[E, A_p]`` may differ in size (a ``Discrete(5)``
  and a ``Discrete(9)`` policy's ``action_dist_inputs``), not in rank: each is padded with
  zeros to the widest; :attr:`extra_shapes` (per policy) and :attr:`agent_extra_shapes`
  (per agent) give each one's true trailing shape, and
  :func:`jaxsampler.policies.groups.unpad_extra` cuts an agent's extra back to it;
* params are a dict ``policy_id -> params``; the recurrent state a dict ``policy_id ->
  state`` with leaves ``[E, A_p, ...]``;
* actions of agents that are not acting are computed like all others and ignored by the
  env and by every host-side conversion (the ``acting`` mask decides); in a turn-based env
  (``Env.max_acting``) with one policy for every agent, the rollout runs it on the acting
  rows only (:meth:`act_on_rows`), and the others' actions are zero placeholders;
* ``log_prob(params, obs, action, policy_state)`` evaluates every policy's ``log_prob`` on
  its own agents, like the step (a group's policy on its rows and actions unpacked to the
  group's spaces); it is available (:attr:`has_log_prob`) only when every policy has one.

:func:`random_policy` is the random policy of any env: per group, from the group's own
action space, when the env has groups.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxsampler.envs.base import Env
from jaxsampler.envs.groups import GroupLayout
from jaxsampler.policies.base import Policy, RandomPolicy
from jaxsampler.policies.groups import (
    check_group_transforms,
    extra_shapes_of,
    group_of_policies,
    merge_extras,
    pack_group_action,
)
from jaxsampler.spaces import Space, compatible, share_one_space
from jaxsampler.transforms.base import Pipeline, Transform, build_pipeline

__all__ = ["MultiAgentPolicy", "random_policy"]


@dataclasses.dataclass(frozen=True, init=False)
class MultiAgentPolicy(Policy):
    """Policies mapped to agents by a static ``policy_mapping_fn``; see the module docstring.

    Args:
        env: the multi-agent env (its ``agent_ids`` and spaces), or a tuple of agent ids.
            A host-stepped env whose agents have their own spaces (``observation_spaces``
            / ``action_spaces``) may map policies of different spaces, one per set of
            agents that share spaces; the :class:`~jaxsampler.sampling.host.HostSampler`
            checks each policy against its agents' spaces, and the policy's own
            ``observation_space`` / ``action_space`` are ``None``.
        policies: ``policy_id -> Policy``.
        policy_mapping_fn: RLlib's ``(agent_id, episode, **kwargs) -> policy_id`` (called
            once per agent, here, with ``episode=None``: the mapping is static) or the
            one-argument ``(agent_id) -> policy_id``; default: every agent uses the only
            policy (an error if there are several).
        transforms: the transforms the rollout will run (as given to ``make_rollout``),
            so that the policies are checked against the spaces they hand the policy
            rather than the env's. Only with an env.

    Raises:
        ValueError: empty ``policies``, a mapping to an unknown policy id, policies built
            for different spaces, or for other spaces than the env's (after
            ``transforms``); with agent groups, a policy whose agents span groups (unless
            built for the carrier), one built for other spaces than its group's (and the
            carrier's), or transforms that change the spaces.
        TypeError: a ``policy_mapping_fn`` that takes neither signature.
    """

    #: the spaces every policy is built for; ``None`` over a host env whose agents have
    #: their own spaces (the host sampler checks each policy against its agents')
    observation_space: Space | None  # type: ignore[assignment]
    action_space: Space | None  # type: ignore[assignment]
    agent_ids: tuple[str, ...]
    policy_ids: tuple[str, ...]
    policies: tuple[Policy, ...]
    #: policy id of every agent-axis slot
    agent_policy: tuple[str, ...]
    #: the env's agent groups (``None``: an env without groups, or agent ids given)
    layout: GroupLayout | None
    #: per policy (``policy_ids``' order): the agent group whose own spaces it is built for,
    #: or ``None``: it plays the rows as they are (the carrier's, with groups)
    policy_groups: tuple[str | None, ...]

    def __init__(
        self,
        env: Env | tuple[str, ...],
        policies: Mapping[str, Policy],
        policy_mapping_fn: Callable[..., str] | None = None,
        *,
        transforms: Sequence[Transform] | Transform | Pipeline | None = None,
    ) -> None:
        if not isinstance(policies, Mapping) or not policies:
            raise ValueError("policies must be a non-empty dict policy_id -> Policy")
        for pid, p in policies.items():
            if not isinstance(p, Policy):
                raise TypeError(
                    f"policies[{pid!r}] is a {type(p).__name__}, not a jaxsampler Policy"
                )
        host_own_spaces = _host_env_with_own_spaces(env)
        if isinstance(env, (tuple, list)):
            agent_ids = tuple(env)
        else:  # an Env, or a host env (its agent ids; the host sampler checks its spaces)
            agent_ids = tuple(env.agent_ids)
        if policy_mapping_fn is None:
            if len(policies) != 1:
                raise ValueError(
                    f"{len(policies)} policies need a policy_mapping_fn (agent_id -> policy_id)"
                )
            only = next(iter(policies))
            mapping = (only,) * len(agent_ids)
        else:
            mapping = tuple(_map_agents(policy_mapping_fn, agent_ids))
        for aid, pid in zip(agent_ids, mapping):
            if pid not in policies:
                raise ValueError(
                    f"policy_mapping_fn maps agent {aid!r} to unknown policy id {pid!r}; "
                    f"policies: {sorted(policies)}"
                )
        layout = env.agent_layout if isinstance(env, Env) else None
        obs_space: Space | None
        act_space: Space | None
        used = tuple(pid for pid in policies if pid in mapping)  # dict order, unused ones dropped
        if layout is not None:
            assert isinstance(env, Env)
            groups = group_of_policies(layout, policies, agent_ids, mapping)
            if transforms is not None:
                check_group_transforms(env.name, layout, _pipeline(env, transforms))
            obs_space, act_space = layout.observation_space, layout.action_space
        elif host_own_spaces is not None:  # the host sampler checks each policy's agents
            groups = dict.fromkeys(used)
            if transforms is not None:
                raise ValueError(
                    f"MultiAgentPolicy: transforms= bind to one space, and the agents of "
                    f"{host_own_spaces} have their own spaces"
                )
            obs_space = act_space = None
        else:
            groups = dict.fromkeys(used)
            first = next(iter(policies.values()))
            _check_same_spaces(policies, first)
            if isinstance(env, Env):
                _check_env_spaces(env, first, transforms)
            elif transforms is not None:
                raise ValueError(
                    "MultiAgentPolicy: transforms= needs a jaxsampler Env (to bind them to its "
                    "spaces); with agent ids or a host env, give the transforms to the sampler"
                )
            obs_space, act_space = first.observation_space, first.action_space
        object.__setattr__(self, "observation_space", obs_space)
        object.__setattr__(self, "action_space", act_space)
        object.__setattr__(self, "agent_ids", agent_ids)
        object.__setattr__(self, "policy_ids", used)
        object.__setattr__(self, "policies", tuple(policies[pid] for pid in used))
        object.__setattr__(self, "agent_policy", mapping)
        object.__setattr__(self, "layout", layout)
        object.__setattr__(self, "policy_groups", tuple(groups[pid] for pid in used))

    # -- static structure ----------------------------------------------------------------

    def agents_of(self, policy_id: str) -> np.ndarray:
        """Agent-axis indices controlled by ``policy_id`` (ascending)."""
        return np.array([i for i, p in enumerate(self.agent_policy) if p == policy_id], np.int64)

    @functools.cached_property
    def extra_shapes(self) -> dict[str, dict[str, Any]]:
        """``{policy_id: {extra key: trailing shape}}``: each policy's own extras and their
        shapes beyond ``[E, A_p]`` (a tuple; for an extra that is a pytree, a pytree of
        tuples, which the samplers do not take), before the step pads them to the widest
        over the policies.

        E.g. ``{"predator": {"action_dist_inputs": (5,), "vf_preds": ()}, "prey":
        {"action_dist_inputs": (9,), "vf_preds": ()}}``; the step's ``action_dist_inputs``
        is then ``[E, A, 9]``, zeros after the 5th logit on the predators' rows. A key a
        policy does not produce is missing from its entry (its agents get zeros). Found by
        tracing each policy once, abstractly (``jax.eval_shape``), on first access.
        """
        return {
            pid: extra_shapes_of(p, len(self.agents_of(pid)))
            for pid, p in zip(self.policy_ids, self.policies)
        }

    @property
    def agent_extra_shapes(self) -> dict[str, dict[str, Any]]:
        """``{agent_id: {extra key: trailing shape}}``: :attr:`extra_shapes` of each agent's
        policy; cut an agent's padded extra back with
        :func:`jaxsampler.policies.groups.unpad_extra`."""
        shapes = self.extra_shapes
        return {a: shapes[p] for a, p in zip(self.agent_ids, self.agent_policy)}

    def policy_mapping_fn(self, agent_id: str, episode: Any = None, **kwargs: Any) -> str:
        """The policy id of ``agent_id`` (RLlib's signature; ``episode`` is ignored)."""
        return self.agent_policy[self.agent_ids.index(agent_id)]

    def _rows(self, tree: Any, pid: str, group: str | None) -> Any:
        """Policy ``pid``'s rows of ``tree`` (``[E, A, ...]``), unpacked to ``group``'s own
        space when it plays one."""
        rows = self._take(tree, self.agents_of(pid))
        if group is None:
            return rows
        assert self.layout is not None
        return self.layout.unpack_obs(group, rows)

    def _take(self, tree: Any, idx: np.ndarray) -> Any:
        n = len(self.agent_ids)
        if len(idx) == n:
            return tree
        if np.all(np.diff(idx) == 1):  # contiguous: a static slice
            return jax.tree.map(lambda x: x[:, int(idx[0]) : int(idx[-1]) + 1], tree)
        return jax.tree.map(lambda x: jnp.take(x, idx, axis=1), tree)

    # -- Policy protocol -----------------------------------------------------------------

    def init(self, key: jax.Array) -> dict[str, Any]:
        """``{policy_id: params}``: each used policy's ``init`` with its own split of ``key``.
        Pure."""
        keys = jax.random.split(key, len(self.policies))
        return {pid: p.init(k) for pid, p, k in zip(self.policy_ids, self.policies, keys)}

    def initial_state(self, batch_shape: tuple[int, ...]) -> dict[str, Any]:
        """``{policy_id: state}`` for ``batch_shape = (*lead, A)``: each policy's initial state
        for ``(*lead, A_p)``, ``A_p`` the number of agents it controls."""
        *lead, _ = batch_shape
        return {
            pid: p.initial_state((*lead, len(self.agents_of(pid))))
            for pid, p in zip(self.policy_ids, self.policies)
        }

    def __call__(
        self, params: Mapping[str, Any], obs: Any, key: jax.Array, policy_state: Any
    ) -> tuple[Any, dict[str, jax.Array], Any]:
        if not isinstance(params, Mapping):
            raise TypeError(
                "MultiAgentPolicy params must be a dict policy_id -> params, got "
                f"{type(params).__name__}"
            )
        missing = [pid for pid in self.policy_ids if pid not in params]
        if missing:
            raise KeyError(f"params have no entry for policies {missing}; got {sorted(params)}")
        keys = jax.random.split(key, len(self.policies))
        actions, extras, states, order, batches = [], [], {}, [], []
        num_envs = jax.tree.leaves(obs)[0].shape[0]
        for pid, p, g, k in zip(self.policy_ids, self.policies, self.policy_groups, keys):
            idx = self.agents_of(pid)
            a, x, s = p(params[pid], self._rows(obs, pid, g), k, policy_state[pid])
            if g is not None:
                assert self.layout is not None
                a = pack_group_action(self.layout, g, pid, a)
            actions.append(a)
            extras.append(x)
            states[pid] = s
            order.append(idx)
            batches.append((num_envs, len(idx)))
        if len(actions) == 1:
            return actions[0], extras[0], states
        inverse = np.argsort(np.concatenate(order))  # concatenated slots -> agent order
        identity = np.array_equal(inverse, np.arange(len(inverse)))

        def merge(parts: list[Any]) -> Any:
            out = jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=1), *parts)
            return out if identity else jax.tree.map(lambda x: jnp.take(x, inverse, axis=1), out)

        return merge(actions), merge(merge_extras(extras, batches, self.policy_ids)), states

    @property
    def acts_on_rows(self) -> bool:
        """Whether :meth:`act_on_rows` can run: one policy plays every agent (self-play with
        a shared policy) and can itself act on rows. With several policies each agent's
        rows go to its own policy, so a turn-based env evaluates them all."""
        return len(self.policies) == 1 and self.policies[0].acts_on_rows

    @property
    def values_on_rows(self) -> bool:
        """Whether :meth:`act_on_rows` takes ``value_rows``: its one policy's does."""
        return self.acts_on_rows and self.policies[0].values_on_rows

    def act_on_rows(
        self,
        params: Mapping[str, Any],
        obs: Any,
        key: jax.Array,
        policy_state: Any,
        rows: Any,
        *,
        value_rows: jax.Array | None = None,
    ) -> tuple[Any, dict[str, jax.Array], Any]:
        """The one policy's :meth:`Policy.act_on_rows` on the agent rows ``rows``
        (``int32[E, k]``), with ``__call__``'s key split; ``value_rows`` is passed on
        (only to a policy that takes it)."""
        if not self.acts_on_rows:
            raise NotImplementedError(
                "MultiAgentPolicy acts on rows only with one policy that can (acts_on_rows)"
            )
        (pid,), (policy,) = self.policy_ids, self.policies
        (k,) = jax.random.split(key, 1)
        kw = {"value_rows": value_rows} if value_rows is not None else {}
        if kw and not policy.values_on_rows:
            raise TypeError(f"{type(policy).__name__}.act_on_rows does not take value_rows")
        (group,) = self.policy_groups
        if group is not None:
            assert self.layout is not None
            obs = self.layout.unpack_obs(group, obs)
        a, x, s = policy.act_on_rows(params[pid], obs, k, policy_state[pid], rows, **kw)
        if group is not None:
            assert self.layout is not None
            a = pack_group_action(self.layout, group, pid, a)
        return a, x, {pid: s}

    @property
    def has_log_prob(self) -> bool:
        """Whether every policy implements ``log_prob``."""
        return all(p.has_log_prob for p in self.policies)

    def log_prob(
        self, params: Mapping[str, Any], obs: Any, action: Any, policy_state: Any
    ) -> jax.Array:
        """Log-probabilities ``float32[E, A]`` of ``action`` (leaves ``[E, A, ...]``), each
        agent's under its own policy (see :meth:`Policy.log_prob`). Pure.

        Raises:
            NotImplementedError: a policy has no ``log_prob`` (it is named).
        """
        missing = [pid for pid, p in zip(self.policy_ids, self.policies) if not p.has_log_prob]
        if missing:
            raise NotImplementedError(
                f"policies {missing} do not implement log_prob, so the MultiAgentPolicy cannot"
            )
        parts, order = [], []
        for pid, p, g in zip(self.policy_ids, self.policies, self.policy_groups):
            idx = self.agents_of(pid)
            act = self._take(action, idx)
            if g is not None:
                assert self.layout is not None
                act = self.layout.unpack_action(g, act)
            parts.append(p.log_prob(params[pid], self._rows(obs, pid, g), act, policy_state[pid]))
            order.append(idx)
        if len(parts) == 1:
            return parts[0]
        inverse = np.argsort(np.concatenate(order))
        out = jnp.concatenate(parts, axis=1)
        if np.array_equal(inverse, np.arange(len(inverse))):
            return out
        return jnp.take(out, inverse, axis=1)


def _host_env_with_own_spaces(env: Any) -> str | None:
    """The class name of ``env`` if it is a host-stepped env (not a jaxsampler ``Env``, not
    a tuple of ids) whose agents one policy cannot serve (``observation_spaces`` /
    ``action_spaces`` of other shapes or dtypes), else ``None``."""
    if isinstance(env, (Env, tuple, list)) or not hasattr(env, "agent_ids"):
        return None
    for what in ("observation_spaces", "action_spaces"):
        spaces = getattr(env, what, None)
        if isinstance(spaces, Mapping) and not share_one_space(spaces.values()):
            return type(env).__name__
    return None


def _check_same_spaces(policies: Mapping[str, Policy], first: Policy) -> None:
    """Raises ``ValueError`` if the policies (of an env without agent groups) were built for
    different spaces."""
    for pid, p in policies.items():
        for what in ("observation_space", "action_space"):
            if not compatible(getattr(p, what), getattr(first, what)):
                raise ValueError(
                    f"policy {pid!r} was built for {what.replace('_', ' ')} "
                    f"{getattr(p, what)!r}, another for {getattr(first, what)!r}: agents on "
                    "one agent axis share one space (pad to a common space, or declare agent "
                    "groups in the env and pass the env, not its agent ids; for a host env "
                    "whose agents have their own spaces, pass the host env)"
                )


def random_policy(env: Env) -> Policy:
    """Uniformly random actions for every agent of ``env``, each from its own action space.

    Without agent groups, :class:`RandomPolicy` on the env's spaces. With agent groups
    (:attr:`Env.agent_layout`), one ``RandomPolicy`` per group, built for the group's own
    spaces, in a :class:`MultiAgentPolicy` (policy ids: the group names): a group with
    ``Discrete(5)`` actions never draws an action of the wider carrier. Its params are
    ``{group: ()}``. The command line (``--policy random``) and the host-side benchmark
    build their random policy with it; so should any code that needs one for an env it
    does not know.
    """
    layout = env.agent_layout
    if layout is None:
        return RandomPolicy(env.observation_space, env.action_space)
    return MultiAgentPolicy(
        env,
        {g.name: RandomPolicy(g.observation_space, g.action_space) for g in layout.groups},
        lambda agent_id: layout.group_of(agent_id).name,
    )


def _pipeline(env: Env, transforms: Any) -> Pipeline:
    """``transforms`` bound to ``env``'s spaces (a bound ``Pipeline`` as it is)."""
    if isinstance(transforms, Pipeline):
        return transforms
    return build_pipeline(transforms, env.observation_space, env.action_space)


def _check_env_spaces(env: Env, policy: Policy, transforms: Any) -> None:
    """Raises ``ValueError`` if ``policy``'s spaces are not what ``env`` hands a policy
    (after ``transforms``)."""
    pipe = _pipeline(env, transforms)
    after = " after its transforms" if pipe else ""
    for what, space in (
        ("observation_space", pipe.observation_space),
        ("action_space", pipe.action_space),
    ):
        if not compatible(getattr(policy, what), space):
            raise ValueError(
                f"the policies were built for {what.replace('_', ' ')} "
                f"{getattr(policy, what)!r}, env {env.name}{after} has {space!r}. If "
                "transforms change the spaces (e.g. ActionMaskFromInfo, FrameStack), pass "
                "them (transforms=...) or pass the agent ids (env.agent_ids) instead of the "
                "env; the rollout checks the spaces against its transforms"
            )


def _map_agents(fn: Callable[..., str], agent_ids: tuple[str, ...]) -> list[str]:
    """``fn``'s policy id for every agent, called as ``fn(agent_id, None)`` (RLlib's
    ``(agent_id, episode, **kwargs)``) or, if it takes one argument, ``fn(agent_id)``."""
    if not callable(fn):
        raise TypeError(f"policy_mapping_fn must be callable, got {type(fn).__name__}")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have no signature: try the short form
        return [fn(aid) for aid in agent_ids]
    for args in (("agent_0", None), ("agent_0",)):
        try:
            sig.bind(*args)
        except TypeError:
            continue
        return [fn(aid, *args[1:]) for aid in agent_ids]
    raise TypeError(
        f"policy_mapping_fn {getattr(fn, '__name__', fn)!r} takes {sig}; it must take "
        "RLlib's (agent_id, episode, **kwargs) or (agent_id)"
    )
