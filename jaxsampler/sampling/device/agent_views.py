"""The columns a multi-agent call's episodes read, and agents' episodes as views of them.

:class:`EpisodeColumns` holds one call's completed agent steps as whole-call columns, rows
in ``sample()``'s order (segment by segment, agent by agent, then by agent timestep), with
one observation (and info) *track* in which each run of an agent's rows in a segment gets
``n + 1`` consecutive rows: its steps' start observations, then its last step's new
observation. :class:`AgentViews` reads an agent's episode of such a run as slices of those
columns (:meth:`SingleAgentEpisode.from_views`' protocol): a finished chunk's agents are
light objects whose columns are built on first access, and whose default getters are one
slice each.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from jaxsampler.episodes._sa_views import EpisodeViews, reward_space
from jaxsampler.episodes.lookback import InfiniteLookbackBuffer, tree_map
from jaxsampler.sampling.device.agent_steps import AgentCarry, AgentSteps, take, take_info, take_obs
from jaxsampler.sampling.device.columns import Columns, obs_map, unflatten

__all__ = ["AgentViews", "EpisodeColumns", "LookbackViews", "episode_columns"]


@dataclasses.dataclass(frozen=True)
class EpisodeColumns:
    """One call's per-agent-step columns for episodes (rows as ``AgentSteps``)."""

    group: np.ndarray  # each row's run of (segment, agent) rows
    run_start: np.ndarray  # each run's first row
    run_stop: np.ndarray  # one past each run's last row
    obs_track: Any  # [n + runs, ...]: a run's rows r0:r1 have track rows r0+g : r1+g+1
    info_track: dict[str, Any]  # nested info leaves on the same rows ({}: no infos)
    actions: np.ndarray
    rewards: np.ndarray
    extras: dict[str, np.ndarray]


class AgentViews(EpisodeViews):
    """Agents' episodes over :class:`EpisodeColumns`, keyed by run: episode ``g`` is the
    run of rows ``r0[g]:r1[g]`` (one agent's steps in one segment, no lookback), its
    observations (and infos) track rows ``r0[g] + g : r1[g] + g + 1``.

    Args:
        data: the call's columns.
        run_start, run_stop: ``int[G]``, each run's first row and one past its last.
        observation_space, action_space: of one agent.
    """

    __slots__ = ("_d", "_r0", "_r1", "_obs", "_obs_space", "_act_space")

    def __init__(
        self,
        data: EpisodeColumns,
        run_start: np.ndarray,
        run_stop: np.ndarray,
        observation_space: Any,
        action_space: Any,
    ):
        self._d = data
        self._r0, self._r1 = run_start.tolist(), run_stop.tolist()
        self._obs = data.obs_track if type(data.obs_track) is np.ndarray else None
        self._obs_space, self._act_space = observation_space, action_space

    def _track(self, g: int) -> slice:
        return slice(self._r0[g] + g, self._r1[g] + g + 1)

    def observations(self, g: int) -> Any:
        """Run ``g``'s observations, its last step's new one included (views)."""
        if self._obs is not None:
            return self._obs[self._r0[g] + g : self._r1[g] + g + 1]
        rows = self._track(g)
        return obs_map(lambda x: x[rows], self._d.obs_track)

    def actions(self, g: int) -> Any:
        """Run ``g``'s actions (a view)."""
        return self._d.actions[self._r0[g] : self._r1[g]]

    def rewards(self, g: int) -> Any:
        """Run ``g``'s rewards (a view)."""
        return self._d.rewards[self._r0[g] : self._r1[g]]

    def extra(self, g: int, name: str) -> Any:
        """Run ``g``'s extra model output ``name`` (a view), or ``None`` where the policy
        has no such output."""
        col = self._d.extras.get(name)
        return None if col is None else col[self._r0[g] : self._r1[g]]

    def column(self, g: int, name: str) -> Any:
        """Run ``g``'s column ``name``: a borrowed buffer over views of the call's columns
        (extra model outputs: a new dict of them)."""
        trusted = InfiniteLookbackBuffer.trusted
        r0, r1 = self._r0[g], self._r1[g]
        if name == "observations":
            return trusted(self.observations(g), 0, self._obs_space)
        if name == "actions":
            return trusted(self._d.actions[r0:r1], 0, self._act_space)
        if name == "rewards":
            return trusted(self._d.rewards[r0:r1], 0, reward_space())
        if name == "extra_model_outputs":
            return {k: trusted(c[r0:r1], 0) for k, c in self._d.extras.items()}
        if name != "infos":
            raise ValueError(f"an episode has no column {name!r}")
        if not self._d.info_track:
            return trusted([{} for _ in range(r1 - r0 + 1)], 0)  # one dict per observation
        rows = self._track(g)
        return trusted(tree_map(lambda x: x[rows], self._d.info_track), 0)


def episode_columns(
    steps: AgentSteps,
    pos: np.ndarray,
    old: AgentCarry,
    cols: Columns,
    call: Columns,
    num_agents: int,
    head: int,
) -> EpisodeColumns:
    """The call's per-row columns for episodes, with each run of an agent's rows in a
    segment given ``n + 1`` consecutive rows of one observation (and info) track: its
    steps' start observations and then its last step's new observation (a run's steps
    follow each other, so a step's new observation is the next one's start).

    ``steps`` in output order, ``pos`` each step's segment, ``old`` the carry the call
    started from; ``cols`` the columns with their ``head``-step head, ``call`` the call's
    own steps."""
    e, s, a, c = steps.env, steps.slot, steps.agent, steps.end
    n = len(e)
    A = num_agents
    # runs of rows: (segment, agent)
    new_run = np.ones(n, bool)
    if n > 1:
        np.not_equal(pos[1:] * A + a[1:], pos[:-1] * A + a[:-1], out=new_run[1:])
    group = np.cumsum(new_run) - 1
    ends = np.flatnonzero(np.append(new_run[1:], n > 0))  # each run's last row (if any)
    # track row of each step's start obs: row + its run; a run's end obs after its last
    G = len(ends)
    te, ts, ta = (np.empty(n + G, np.int64) for _ in range(3))
    at = np.arange(n) + group
    te[at], ts[at], ta[at] = e, s, a
    at_end = ends + group[ends] + 1
    te[at_end], ts[at_end], ta[at_end] = e[ends], c[ends], a[ends]
    obs_track = take_obs(call.obs, old.obs, te, ts, ta)
    infos = call.infos
    info_track = (
        unflatten({k: take_info(v, old.info[k], te, ts, ta, A) for k, v in infos.items()})
        if infos
        else {}
    )
    return EpisodeColumns(
        group=group,
        run_start=np.flatnonzero(new_run),
        run_stop=ends + 1,
        obs_track=obs_track,
        info_track=info_track,
        actions=take(cols.actions, old.action, e, s, a, head),
        rewards=steps.reward.astype(np.float32, copy=False),
        extras={k: take(col, old.extras[k], e, s, a, head) for k, col in cols.extras.items()},
    )


class LookbackViews(EpisodeViews):
    """Agents' episodes with lookback over columns laid out episode by episode, keyed by
    position ``k``: episode ``k``'s observations (and infos) are the rows
    ``o[k] : o[k] + n[k] + m[k] + 1`` of ``obs`` (``n[k]`` lookback rows, then ``m[k] + 1``
    after it), its actions, rewards and extra model outputs the rows
    ``a[k] : a[k] + n[k] + m[k]`` (``n[k]`` lookback items). Each episode's rows are its
    own: no other episode reads them.

    Args:
        obs, infos: the observation column (an array or a struct of arrays) and the info
            leaves on its rows (``{}``: no infos, one empty dict per observation).
        actions, rewards, extras: the action, reward and extra model output columns.
        obs_start, act_start, lookback, length: ``o``, ``a``, ``n``, ``m`` (``int[K]``).
        observation_space, action_space: of one agent.
        borrowed: mark every column built here borrowed (its first in-place write copies
            it), as the buffers of episodes cut from built chunks are.
    """

    __slots__ = (
        "_obs",
        "_flat",
        "_infos",
        "_acts",
        "_rews",
        "_extras",
        "_o",
        "_a",
        "_n",
        "_m",
        "_obs_space",
        "_act_space",
        "_borrowed",
    )

    def __init__(
        self,
        obs: Any,
        infos: dict[str, Any],
        actions: np.ndarray,
        rewards: np.ndarray,
        extras: dict[str, np.ndarray],
        obs_start: np.ndarray,
        act_start: np.ndarray,
        lookback: np.ndarray,
        length: np.ndarray,
        observation_space: Any,
        action_space: Any,
        borrowed: bool = False,
    ):
        self._obs, self._flat, self._infos = obs, type(obs) is np.ndarray, infos
        self._borrowed = borrowed
        self._acts, self._rews, self._extras = actions, rewards, extras
        self._o, self._a = obs_start.tolist(), act_start.tolist()
        self._n, self._m = lookback.tolist(), length.tolist()
        self._obs_space, self._act_space = observation_space, action_space

    def pristine(self, episode: Any) -> int | None:
        """``episode``'s key if it is one of these views with no column built yet (its
        data are then exactly its rows here), else ``None``."""
        if (
            episode._view is self
            and episode._observations is None
            and episode._infos is None
            and episode._actions is None
            and episode._rewards is None
            and episode._extra_model_outputs is None
        ):
            return int(episode._key)
        return None

    def lookback(self, k: int) -> int:
        """Episode ``k``'s lookback items (``n[k]``)."""
        return self._n[k]

    def output_names(self) -> list[str]:
        """The extra model outputs every episode here has."""
        return list(self._extras)

    def starts(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(o[keys], a[keys])``: where episodes ``keys``' observation and item rows start."""
        return np.asarray(self._o, np.int64)[keys], np.asarray(self._a, np.int64)[keys]

    def arrays(self) -> tuple[Any, dict[str, Any], np.ndarray, np.ndarray, dict[str, Any]]:
        """The shared columns: observations, infos, actions, rewards, extra model outputs."""
        return self._obs, self._infos, self._acts, self._rews, self._extras

    def _rows(self, k: int, lookback: bool) -> slice:
        o = self._o[k]
        return slice(o if lookback else o + self._n[k], o + self._n[k] + self._m[k] + 1)

    def _items(self, k: int, lookback: bool) -> slice:
        a = self._a[k]
        return slice(a if lookback else a + self._n[k], a + self._n[k] + self._m[k])

    def observations(self, k: int) -> Any:
        """Episode ``k``'s observations after its lookback (views)."""
        rows = self._rows(k, False)
        return self._obs[rows] if self._flat else obs_map(lambda x: x[rows], self._obs)

    def actions(self, k: int) -> Any:
        """Episode ``k``'s actions after its lookback (a view)."""
        return self._acts[self._items(k, False)]

    def rewards(self, k: int) -> Any:
        """Episode ``k``'s rewards after its lookback (a view)."""
        return self._rews[self._items(k, False)]

    def extra(self, k: int, name: str) -> Any:
        """Episode ``k``'s extra model output ``name`` after its lookback (a view), or
        ``None`` where the policy has no such output."""
        col = self._extras.get(name)
        return None if col is None else col[self._items(k, False)]

    def column(self, k: int, name: str) -> Any:
        """Episode ``k``'s column ``name`` with its ``n[k]`` lookback items, over views of
        its own rows (owned: in-place writes touch no other episode's data; only the
        actions and rewards of an episode without lookback are marked borrowed, as the
        episodes cut from built chunks have them)."""
        trusted = InfiniteLookbackBuffer.trusted
        n, all_borrowed = self._n[k], self._borrowed
        if name == "observations":
            rows = self._rows(k, True)
            obs = self._obs[rows] if self._flat else obs_map(lambda x: x[rows], self._obs)
            return trusted(obs, n, self._obs_space, borrowed=all_borrowed)
        items = self._items(k, True)
        lent = all_borrowed or n == 0
        if name == "actions":
            return trusted(self._acts[items], n, self._act_space, borrowed=lent)
        if name == "rewards":
            return trusted(self._rews[items], n, reward_space(), borrowed=lent)
        if name == "extra_model_outputs":
            return {
                key: trusted(c[items], n, borrowed=all_borrowed) for key, c in self._extras.items()
            }
        if name != "infos":
            raise ValueError(f"an episode has no column {name!r}")
        if not self._infos:
            return trusted([{} for _ in range(n + self._m[k] + 1)], n)
        rows = self._rows(k, True)
        return trusted(tree_map(lambda x: x[rows], self._infos), n, borrowed=all_borrowed)
