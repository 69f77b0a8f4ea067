"""Extras of off-policy steps: the outputs of whatever chose the recorded action.

A host env may take an action itself (``PollResult.off_policy_actions``): an
``ExternalEnv.log_action`` caller, or a local-inference
:class:`~jaxsampler.serving.client.PolicyClient` that ran its own copy of the policy. The
host sampler records that action, so the step's extras must describe *it*, not the
server policy's own sample of the same observation (whose ``action_logp`` belongs to an
unrelated action). Per off-policy row, in this order:

1. **Behaviour outputs from the step's info** (:func:`behaviour_outputs`):

   * local inference: ``info[CLIENT_POLICY_INFO]["extra_model_outputs"]`` (the client's
     ``action_logp``, ``vf_preds``, ... under the weights version that produced the action)
     replaces every extra of the same name;
   * a ``log_action`` caller that knows its behaviour log-probability passes it as
     ``info={"action_logp": x}`` (:data:`CALLER_LOGP_INFO`); the client's value wins if
     both are given.

   A value that does not fit the column (another shape, not a number) is not used
   (counted as ``rejected``); the row then falls through to 2. The infos themselves are
   recorded unchanged, so the client's ``weights_version`` stays in the row's info.
2. **``action_logp`` computed**: the log-probability of the recorded action under the
   current policy (:meth:`~jaxsampler.policies.base.Policy.log_prob`), one extra jitted
   call per batch that needs it.
3. Else ``action_logp`` is NaN: never the logp of another action.

Extras that are functions of the observation (``vf_preds``) keep the server forward
pass's values unless the client sent its own. Only flat extras (one array per name) are
corrected; nested extras are left as the forward pass made them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxsampler.episodes.batch import SampleBatch
from jaxsampler.host_envs.external import CLIENT_POLICY_INFO

__all__ = [
    "CALLER_LOGP_INFO",
    "OffPolicyCounts",
    "behaviour_outputs",
    "fit_row",
    "off_policy_extras",
]

#: The info key by which a ``log_action`` caller gives the behaviour log-probability of its
#: action (RLlib's ``action_logp`` column name).
CALLER_LOGP_INFO = SampleBatch.ACTION_LOGP

_ACTION_LOGP = SampleBatch.ACTION_LOGP


@dataclasses.dataclass
class OffPolicyCounts:
    """Off-policy rows recorded by a host sampler, by where their extras came from.

    Attributes:
        rows: off-policy rows recorded.
        given: rows with at least one extra taken from their info (client or caller).
        rejected: info values not used because they do not fit their column.
        computed_logp: rows whose ``action_logp`` was computed with ``Policy.log_prob``.
        nan_logp: rows whose ``action_logp`` is NaN (no value given, no ``log_prob``).
    """

    rows: int = 0
    given: int = 0
    rejected: int = 0
    computed_logp: int = 0
    nan_logp: int = 0


def behaviour_outputs(info: Any) -> dict[str, Any]:
    """The extras an off-policy step's info gives: the caller's ``action_logp``
    (:data:`CALLER_LOGP_INFO`), overridden by a local-inference client's
    ``extra_model_outputs``; ``{}`` if none (or ``info`` is not a dict)."""
    if not isinstance(info, Mapping):
        return {}
    out: dict[str, Any] = {}
    if CALLER_LOGP_INFO in info:
        out[_ACTION_LOGP] = info[CALLER_LOGP_INFO]
    client = info.get(CLIENT_POLICY_INFO)
    if isinstance(client, Mapping):
        outputs = client.get("extra_model_outputs")
        if isinstance(outputs, Mapping):
            out.update(outputs)
    return out


def fit_row(value: Any, col: np.ndarray) -> np.ndarray | None:
    """``value`` as one row of ``col`` (``[B, 1, *shape]``): an array of ``shape`` and
    ``col``'s dtype, or ``None`` if it is not numeric or has another shape."""
    if isinstance(value, (str, bytes)) or value is None:
        return None
    try:
        x = np.asarray(value)
        if x.dtype.kind not in "biuf" or x.shape != col.shape[2:]:
            return None
        return x.astype(col.dtype, copy=False)
    except (TypeError, ValueError, OverflowError):
        return None


def off_policy_extras(
    extras: dict[str, Any],
    rows: Sequence[int],
    given: Sequence[Mapping[str, Any]],
    logp_of: Callable[[list[int]], np.ndarray] | None,
    counts: OffPolicyCounts,
) -> dict[str, Any]:
    """The forward pass's extras with the off-policy rows corrected (module docstring).

    Args:
        extras: the policy's host extras of one call, leaves ``[B, 1, ...]``.
        rows: the off-policy rows (indices into ``B``).
        given: per row of ``rows``, :func:`behaviour_outputs` of its info.
        logp_of: ``rows -> float[len(rows)]``, the log-probabilities of those rows'
            recorded actions under the current policy (one policy call), or ``None`` if
            the policy has no ``log_prob``.
        counts: updated in place.

    Returns:
        A new dict; the corrected columns are copies, the input arrays are not written.
    """
    counts.rows += len(rows)
    fixed = {k: np.array(v) for k, v in extras.items() if isinstance(v, np.ndarray)}
    logp = fixed.get(_ACTION_LOGP)
    if logp is not None and logp.dtype.kind != "f":
        logp = None  # not a log-probability column this module can mark with NaN
    missing_logp = []
    for i, values in zip(rows, given):
        used = logp_set = False
        for k, v in values.items():
            col = fixed.get(k)
            if col is None:
                continue  # not one of this policy's extras (it stays in the info)
            x = fit_row(v, col)
            if x is None:
                counts.rejected += 1
                continue
            col[i, 0] = x
            used = True
            logp_set = logp_set or k == _ACTION_LOGP
        counts.given += used
        if not logp_set:
            missing_logp.append(i)
    if missing_logp and logp is not None:
        if logp_of is None:
            logp[missing_logp, 0] = np.nan
            counts.nan_logp += len(missing_logp)
        else:
            logp[missing_logp, 0] = logp_of(missing_logp)
            counts.computed_logp += len(missing_logp)
    return {**extras, **fixed}
