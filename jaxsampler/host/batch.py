"""``SampleBatch``: a dict of equally long columns (RLlib's column names)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["SampleBatch"]


class SampleBatch(dict):
    """Columns of per-timestep data; ``count`` is the number of rows.

    Column names follow RLlib: ``obs``, ``new_obs``, ``actions``, ``rewards``,
    ``terminateds``, ``truncateds``, ``eps_id``, ``agent_index``, ``t``, ``infos``,
    ``action_logp``, ``vf_preds``, ...
    """

    OBS, NEXT_OBS, ACTIONS, REWARDS = "obs", "new_obs", "actions", "rewards"
    TERMINATEDS, TRUNCATEDS, EPS_ID, AGENT_INDEX, T, INFOS = "terminateds", "truncateds", "eps_id", "agent_index", "t", "infos"
    ACTION_LOGP, VF_PREDS = "action_logp", "vf_preds"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        lengths = {k: _length(v) for k, v in self.items()}
        known = {n for n in lengths.values() if n is not None}
        if len(known) > 1:
            raise ValueError(f"SampleBatch columns have different lengths: {lengths}")
        self.count = known.pop() if known else 0

    def __len__(self) -> int:  # type: ignore[override]
        return self.count

    def env_steps(self) -> int:
        return self.count

    def agent_steps(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"SampleBatch({self.count}: {list(self.keys())})"

    __str__ = __repr__


def _length(v: Any) -> int | None:
    if isinstance(v, (list, tuple)):
        return len(v)
    if isinstance(v, np.ndarray):
        return v.shape[0] if v.ndim else None
    if isinstance(v, dict):
        for x in v.values():
            n = _length(x)
            if n is not None:
                return n
    return None
