"""Names every layer shares: the default agent and policy ids, RLlib's episode-wide
done key and the keys of a masked observation. One table, so the device env, the
episodes, the samplers, the transforms and the host envs can never disagree."""

from __future__ import annotations

__all__ = ["ALL_AGENTS", "DEFAULT_AGENT_ID", "DEFAULT_POLICY_ID", "MASK_KEY", "OBS_KEY"]

#: The agent id of a single-agent env (RLlib's ``DEFAULT_AGENT_ID``).
DEFAULT_AGENT_ID = "default_agent"
#: The policy (module) id of a single policy (RLlib's ``DEFAULT_POLICY_ID``).
DEFAULT_POLICY_ID = "default_policy"
#: The episode-wide key of done dicts (``terminateds["__all__"]``), as in RLlib.
ALL_AGENTS = "__all__"
#: A masked observation is ``{OBS_KEY: observation, MASK_KEY: legal-action mask}`` (the keys
#: of RLlib's action-masking example): the masking policies and transforms read these.
OBS_KEY = "observations"
MASK_KEY = "action_mask"
