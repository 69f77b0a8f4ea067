"""Getters and setters of :class:`~jaxsampler.episodes.multi_agent.MultiAgentEpisode`:
RLlib's ``get_*`` / ``set_*`` API over env steps and agent steps."""

from __future__ import annotations

import copy
from collections.abc import Collection
from typing import Any

import numpy as np

from jaxsampler.episodes._ma_agents import _OUT, SKIP, _AgentBookkeeping
from jaxsampler.episodes._tree import batch, tree_map
from jaxsampler.episodes.lookback import InfiniteLookbackBuffer

__all__: list[str] = []


class _Getters(_AgentBookkeeping):
    """Reads and writes the agents' data by env step or by agent step."""

    # -- getters -----------------------------------------------------------------------

    def _agent_list(self, agent_ids: Any) -> list:
        if agent_ids is None or (isinstance(agent_ids, Collection) and not agent_ids):
            return list(self.agent_episodes)  # (an empty collection: all agents, as RLlib)
        if isinstance(agent_ids, str) or not isinstance(agent_ids, Collection):
            agent_ids = [agent_ids]
        return [a for a in agent_ids if a in self.agent_episodes]

    def _positions(self, indices: Any, nial: bool, out_ok: bool, n_items: int) -> Any:
        """Env-step ``indices`` resolved to map positions (``_OUT`` where out of range if
        ``out_ok``, else ``IndexError``)."""
        if (
            isinstance(indices, slice)
            and indices.start is not None
            and indices.start == indices.stop
        ):
            return []  # an empty slice selects no env step, in range or not
        buf = InfiniteLookbackBuffer(list(range(n_items)), self._len_lookback_buffers)
        return buf.get(indices, neg_index_as_lookback=nial, fill=_OUT if out_ok else None)

    def _get(
        self,
        what: str,
        key: Any,
        indices: Any,
        agent_ids: Any,
        env_steps: bool,
        nial: bool,
        fill: Any,
        one_hot: bool,
        return_list: bool,
    ) -> Any:
        """What every getter returns: ``what`` (``key`` of the extras) of ``agent_ids`` at
        ``indices``, by env step or (``env_steps=False``) by each agent's own step."""
        if return_list and not env_steps:
            raise ValueError(
                f"`MultiAgentEpisode.get_{what}()` can't be called with both `env_steps=False` "
                "and `return_list=True`!"
            )
        agents = self._agent_list(agent_ids)
        if not env_steps:
            return self._get_agent_steps(what, key, indices, agents, nial, fill, one_hot)
        if not agents:  # (indices are checked against the agents' maps: none, no error)
            return [] if return_list else {}
        per_step = what in ("observations", "infos")
        n_items = self._map_len() - (0 if per_step else 1)
        # (per-step lists treat an index outside the data as a step without data)
        pos = self._positions(indices, nial, fill is not None or return_list, n_items)
        scalar = not isinstance(pos, list)
        # (RLlib deviation (18): an int index with return_list gives a one-item list; RLlib
        # fails an assertion)
        positions = [pos] if scalar else pos
        values = {a: self._agent_values(what, key, a, positions, fill, one_hot) for a in agents}
        if return_list:
            return [
                {a: v[i] for a, v in values.items() if v[i] is not _OUT}
                for i in range(len(positions))
            ]
        out = {}
        for a, vals in values.items():
            kept = [v for v in vals if v is not _OUT]
            if scalar:
                if kept:
                    out[a] = kept[0]
            elif kept:
                sa_buf = self._column(a, what, key)
                # (batched in the items' common dtype: numpy'ized rewards with fill keep the
                # stored one, RLlib deviation (14): RLlib's is float32 when the first item is
                # a fill value, else float64; infos are never numpy'ized, so info getters
                # with fill give lists of dicts, RLlib deviation (15): RLlib batches the fill
                # dicts into arrays, or raises)
                out[a] = batch(kept) if sa_buf is not None and sa_buf.finalized else kept
        return out

    def _column(self, aid: Any, what: str, key: Any) -> InfiniteLookbackBuffer | None:
        """``aid``'s buffer of ``what`` (of extra ``key``; ``None`` if it has none)."""
        sa = self.agent_episodes[aid]
        if what == "extra_model_outputs":
            return sa.extra_model_outputs.get(key)
        return getattr(sa, what)

    def _hanging(self, aid: Any, what: str, key: Any) -> Any:
        """``aid``'s cached (hanging) value of ``what``, or ``_OUT`` if it is not hanging."""
        if aid not in self._hanging_actions_end:
            return _OUT
        if what == "actions":
            return self._hanging_actions_end[aid]
        if what == "rewards":
            return self._hanging_rewards_end.get(aid, 0.0)
        if what == "extra_model_outputs":
            return self._hanging_extra_model_outputs_end.get(aid, {}).get(key, _OUT)
        return _OUT

    def _agent_values(
        self, what: str, key: Any, aid: Any, positions: list, fill: Any, one_hot: bool
    ) -> list:
        """``aid``'s values at env-step map ``positions``: its item where it has one, its
        hanging value one past its data, else the fill item or ``_OUT``.

        RLlib deviation (1): on ``cut`` chunks too (RLlib's env-step getters of actions,
        rewards and extras lose items there)."""
        m = self.env_t_to_agent_t[aid]
        buf = self._column(aid, what, key)
        hanging = self._hanging(aid, what, key)
        t0 = self.agent_t_started.get(aid, 0)
        filler = None
        out = []
        for p in positions:
            v = _OUT
            agent_t = m.data[p] if p is not _OUT and 0 <= p < len(m.data) else SKIP
            if agent_t != SKIP:
                assert isinstance(agent_t, int)
                lb = (
                    buf.lookback
                    if buf is not None
                    else self.agent_episodes[aid].observations.lookback
                )
                q = agent_t - t0 + lb
                n = buf.len_incl_lookback() if buf is not None else 0
                if buf is not None and 0 <= q < n:
                    v = buf._item_at(q, None, one_hot)
                elif q == n and hanging is not _OUT:
                    v = _like_buffer(buf, hanging, one_hot)
            if v is _OUT and fill is not None:
                if filler is None:  # (also for extras: RLlib deviation (13), RLlib raises
                    # AttributeError for env-step extras with fill)
                    ref = buf if buf is not None else InfiniteLookbackBuffer()
                    filler = ref._fill_item(fill, one_hot)
                v = filler
            out.append(v)
        return out

    def _get_agent_steps(
        self, what: str, key: Any, indices: Any, agents: list, nial: bool, fill: Any, one_hot: bool
    ) -> dict:
        """``{agent: values}`` at ``indices`` of each agent's own steps; a hanging agent's
        cached value counts as one step past its data.

        RLlib deviation (12): with ``neg_index_as_lookback`` the indices are resolved in the
        agent's own data only (RLlib appends a cached hanging value first, also a 0.0 reward
        of an agent that is not hanging)."""
        out = {}
        for a in agents:
            buf = self._column(a, what, key)
            hanging = self._hanging(a, what, key)
            if buf is None:
                if hanging is _OUT:
                    continue
                buf = InfiniteLookbackBuffer([])
            if indices is not None and hanging is not _OUT:
                buf = _with_item(buf, hanging)
            kwargs = (
                {"one_hot_discrete": one_hot}
                if what not in ("rewards", "infos", "extra_model_outputs")
                else {}
            )
            value = buf.get(indices, neg_index_as_lookback=nial, fill=fill, **kwargs)
            if isinstance(value, list) and not value:
                continue  # no data in range: the agent is left out (as RLlib does)
            out[a] = value
        return out

    def get_observations(
        self,
        indices: Any = None,
        agent_ids: Any = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
        return_list: bool = False,
    ) -> Any:
        """Like RLlib's: the agents' observations at ``indices``.

        ``{agent_id: values}`` at ``indices`` (an int, a list or a slice; ``None``: all) of
        the env steps (by default) or of each agent's own steps (``env_steps=False``); with
        ``return_list``, one ``{agent_id: value}`` dict per env step. ``fill`` pads indices
        outside the data; ``one_hot_discrete`` one-hot encodes discrete values."""
        return self._get(
            "observations",
            None,
            indices,
            agent_ids,
            env_steps,
            neg_index_as_lookback,
            fill,
            one_hot_discrete,
            return_list,
        )

    def get_infos(
        self,
        indices: Any = None,
        agent_ids: Any = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        return_list: bool = False,
    ) -> Any:
        """Like RLlib's: the agents' infos at ``indices`` (as in :meth:`get_observations`)."""
        return self._get(
            "infos",
            None,
            indices,
            agent_ids,
            env_steps,
            neg_index_as_lookback,
            fill,
            False,
            return_list,
        )

    def get_actions(
        self,
        indices: Any = None,
        agent_ids: Any = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
        return_list: bool = False,
    ) -> Any:
        """Like RLlib's: the agents' actions at ``indices`` (as in :meth:`get_observations`)."""
        return self._get(
            "actions",
            None,
            indices,
            agent_ids,
            env_steps,
            neg_index_as_lookback,
            fill,
            one_hot_discrete,
            return_list,
        )

    def get_rewards(
        self,
        indices: Any = None,
        agent_ids: Any = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        return_list: bool = False,
    ) -> Any:
        """Like RLlib's: the agents' rewards at ``indices`` (as in :meth:`get_observations`)."""
        return self._get(
            "rewards",
            None,
            indices,
            agent_ids,
            env_steps,
            neg_index_as_lookback,
            fill,
            False,
            return_list,
        )

    def get_extra_model_outputs(
        self,
        key: str | None = None,
        indices: Any = None,
        agent_ids: Any = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        return_list: bool = False,
    ) -> Any:
        """Like RLlib's: extra model outputs, ``{agent: values}`` for ``key`` and
        ``{agent: {key: values}}`` for all keys (``key=None``); indices as in
        :meth:`get_observations`.

        RLlib deviation (2): ``env_steps=False`` with a ``key`` works (RLlib raises
        ``TypeError``). RLlib deviation (7): extras only an agent's hanging step has so far
        are returned (RLlib raises ``KeyError``)."""
        if key is not None:
            return self._get(
                "extra_model_outputs",
                key,
                indices,
                agent_ids,
                env_steps,
                neg_index_as_lookback,
                fill,
                False,
                return_list,
            )
        keys: dict[str, None] = {}
        for a in self._agent_list(agent_ids):
            keys.update((k, None) for k in self.agent_episodes[a].extra_model_outputs)
            # (hanging-only keys too: RLlib deviation (7))
            keys.update((k, None) for k in self._hanging_extra_model_outputs_end.get(a, {}))
        per_key = {
            k: self._get(
                "extra_model_outputs",
                k,
                indices,
                agent_ids,
                env_steps,
                neg_index_as_lookback,
                fill,
                False,
                return_list,
            )
            for k in keys
        }
        if return_list:
            steps = len(next(iter(per_key.values()))) if per_key else 0
            return [
                {
                    a: {k: per_key[k][i][a] for k in keys if a in per_key[k][i]}
                    for a in {a for k in keys for a in per_key[k][i]}
                }
                for i in range(steps)
            ]
        out: dict[Any, dict] = {}
        for k, d in per_key.items():
            for a, v in d.items():
                out.setdefault(a, {})[k] = v
        return out

    # -- setters (agent steps, delegated to the agents' episodes) ------------------------

    def _set(self, name: str, new_data: dict, **kw: Any) -> None:
        """Calls each agent's episode's setter ``name`` with its part of ``new_data``."""
        for aid, data in new_data.items():
            if aid not in self.agent_episodes:
                raise KeyError(
                    f"unknown agent {aid!r}; this episode has "
                    f"{sorted(map(str, self.agent_episodes))}"
                )
            getattr(self.agent_episodes[aid], name)(new_data=data, **kw)

    def set_observations(
        self, *, new_data: dict, at_indices: Any = None, neg_index_as_lookback: bool = False
    ) -> None:
        """Like RLlib's: overwrites each agent's observations at ``at_indices`` of its own
        steps with its part of ``new_data`` (``{agent_id: data}``)."""
        self._set(
            "set_observations",
            new_data,
            at_indices=at_indices,
            neg_index_as_lookback=neg_index_as_lookback,
        )

    def set_actions(
        self, *, new_data: dict, at_indices: Any = None, neg_index_as_lookback: bool = False
    ) -> None:
        """Like RLlib's: overwrites each agent's actions at ``at_indices`` of its own
        steps with its part of ``new_data`` (``{agent_id: data}``)."""
        self._set(
            "set_actions",
            new_data,
            at_indices=at_indices,
            neg_index_as_lookback=neg_index_as_lookback,
        )

    def set_rewards(
        self, *, new_data: dict, at_indices: Any = None, neg_index_as_lookback: bool = False
    ) -> None:
        """Like RLlib's: overwrites each agent's rewards at ``at_indices`` of its own
        steps with its part of ``new_data`` (``{agent_id: data}``)."""
        self._set(
            "set_rewards",
            new_data,
            at_indices=at_indices,
            neg_index_as_lookback=neg_index_as_lookback,
        )

    def set_extra_model_outputs(
        self,
        *,
        key: str,
        new_data: dict,
        at_indices: Any = None,
        neg_index_as_lookback: bool = False,
    ) -> None:
        """Like RLlib's: overwrites each agent's extra model output ``key`` at
        ``at_indices`` of its own steps with its part of ``new_data``."""
        self._set(
            "set_extra_model_outputs",
            new_data,
            key=key,
            at_indices=at_indices,
            neg_index_as_lookback=neg_index_as_lookback,
        )


def _with_item(buf: InfiniteLookbackBuffer, item: Any) -> InfiniteLookbackBuffer:
    """A copy of ``buf`` with ``item`` appended (``buf`` itself is unchanged).

    RLlib deviation (17): a list-mode buffer stays a list (RLlib's ``np.append`` makes
    agent-step slices of hanging agents arrays)."""
    out = copy.copy(buf)
    if not buf.finalized:
        out.data = list(buf.data)
    out.append(item)
    return out


def _like_buffer(buf: InfiniteLookbackBuffer | None, item: Any, one_hot: bool) -> Any:
    """A cached (hanging) item as ``buf`` would return it: numpy scalars/arrays in numpy mode."""
    if buf is None:
        return item
    if buf.finalized:
        item = (
            tree_map(lambda x: np.asarray(x)[()], item)
            if isinstance(item, (dict, tuple))
            else np.asarray(item)[()]
        )
    return buf._convert(item, one_hot) if one_hot else item
