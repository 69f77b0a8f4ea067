"""Names every layer shares: the default agent and policy ids and RLlib's episode-wide
done key. One table, so the device env, the episodes, the samplers and the host envs can
never disagree."""

from __future__ import annotations

__all__ = ["ALL_AGENTS", "DEFAULT_AGENT_ID", "DEFAULT_POLICY_ID"]

#: The agent id of a single-agent env (RLlib's ``DEFAULT_AGENT_ID``).
DEFAULT_AGENT_ID = "default_agent"
#: The policy (module) id of a single policy (RLlib's ``DEFAULT_POLICY_ID``).
DEFAULT_POLICY_ID = "default_policy"
#: The episode-wide key of done dicts (``terminateds["__all__"]``), as in RLlib.
ALL_AGENTS = "__all__"
