"""``ExternalEnv`` / ``ExternalMultiAgentEnv``: a simulator drives the loop, a sampler polls.

The simulator calls, from any number of threads, ``start_episode``, ``get_action``
(blocks until the sampler answers), ``log_action`` (an action the simulator took itself),
``log_returns`` and ``end_episode`` (RLlib's ExternalEnv API). The sampler sees a
:class:`~jaxsampler.host_envs.base.HostEnv`: one sub-env per running episode,
``env_id`` = episode id. ``poll()`` blocks until at least one request is ready, then
waits at most ``max_wait_s`` for more (returning early once every running episode has a
request waiting), so concurrent ``get_action`` calls are answered by one batched policy
call; ``send_actions`` wakes exactly the callers answered.

Per episode, one poll delivers one step: the first request is the first observation;
each later request carries the rewards logged since the previous one; ``end_episode``
delivers the final observation with ``terminateds = {agent: True, "__all__": True}``
(``truncated=True`` gives the truncated flags instead). ``log_action`` steps arrive with
their action in ``off_policy_actions``; they do not block the caller (only when more than
``max_queued_steps`` steps of that episode wait to be polled: back pressure).

Deviations from RLlib, on purpose:

* infos belong to the step they were logged in (RLlib's infos stick to later steps);
* ``log_action`` returns at once instead of waiting up to 60 s for an ignored action;
* an episode whose client goes away (``abandon_episode``, ``get_action`` timeout, no call
  for ``episode_timeout_s``) ends as *truncated*: if its last request was not yet polled,
  that request becomes the final observation; otherwise the last observation is repeated.
  Its info has ``"abandoned": True``; nothing of other episodes is touched, and no
  episode stays open forever (RLlib leaks them);
* ids of finished episodes are remembered (for the "already completed" error) only up to
  ``max_finished_ids``, as fixed-size hashes, so memory stays bounded;
* every resource a client can take is bounded: episode ids (``max_episode_id_len``),
  running episodes overall and per ``owner`` (``max_concurrent_episodes``,
  ``max_episodes_per_owner``), their lifetime without calls (``episode_timeout_s``,
  600 s by default) and summed rewards (float32 range). An episode that never sent a
  request does not hold up ``poll``'s wait for more requests.

Owners: the policy server passes an ``owner`` (a client's identity) to
:meth:`ExternalEnvBase.start_episode` and to the agent-dict methods; another owner's
episodes then look unknown to it (:class:`UnknownEpisodeError`, the message of an
unknown id), and :meth:`ExternalEnvBase.abandon_owner` ends all episodes of a client that
went away. In-process callers pass no owner and may use every episode.

Locally inferred steps (:class:`~jaxsampler.serving.client.PolicyClient` in ``local``
mode) are ``log_action`` steps too (the ``off_policy_actions`` channel is how the
HostEnv protocol records an action the env side chose) whose info has
:data:`CLIENT_POLICY_INFO` = ``{"weights_version": int, "extra_model_outputs": {...}}``;
that key tells them apart from truly off-policy actions and carries behaviour logp and
policy version.

The rooms: :mod:`~jaxsampler.host_envs.external.env` (the env classes: the simulator's and
the sampler's calls), :mod:`~jaxsampler.host_envs.external.episodes` (the per-episode
book-keeping under the env's one lock: episode table, quotas, finished ids, abandonment,
reaping), :mod:`~jaxsampler.host_envs.external.checks` (what callers may send) and
:mod:`~jaxsampler.host_envs.external.errors`.
"""

from jaxsampler.host_envs.external.checks import MAX_REWARD, check_reward
from jaxsampler.host_envs.external.env import (
    CLIENT_POLICY_INFO,
    ExternalEnv,
    ExternalEnvBase,
    ExternalMultiAgentEnv,
)
from jaxsampler.host_envs.external.episodes import Waiter
from jaxsampler.host_envs.external.errors import (
    CapacityError,
    EnvClosedError,
    EpisodeStateError,
    ExternalEnvError,
    InvalidDataError,
    UnknownEpisodeError,
    WouldBlockError,
)

__all__ = [
    "ExternalEnvBase",
    "ExternalEnv",
    "ExternalMultiAgentEnv",
    "ExternalEnvError",
    "UnknownEpisodeError",
    "EpisodeStateError",
    "InvalidDataError",
    "CapacityError",
    "WouldBlockError",
    "EnvClosedError",
    "CLIENT_POLICY_INFO",
    "Waiter",
    "check_reward",
    "MAX_REWARD",
]
