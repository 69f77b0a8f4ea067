"""TicTacToe: two players take turns on a 3x3 board (agents act out of lockstep).

``agent_0`` plays X and moves first, ``agent_1`` plays O. Exactly one agent acts per step:
``TimeStep.acting`` is ``[True, False]`` after a reset and alternates after every move.
The action (``Discrete(9)``) is a cell index ``row * 3 + col``; the action of the agent
that is not on turn is ignored.

Rules of one step (the mover is the agent on turn):

* the chosen cell is empty: the mover's mark is placed there. Three of the mover's marks
  in a row, column or diagonal: the mover gets +1, the opponent -1, both are terminated.
  Otherwise a full board is a draw: both get 0 and are terminated. Otherwise the turn
  passes to the opponent and both get 0.
* the chosen cell is occupied (an illegal move): the board is left unchanged and the
  mover loses, as if it had resigned: the mover gets -1, the opponent +1, both are
  terminated. So uniformly random play gives short, valid games; mask with the legal
  moves (below) to play only legal ones.

A legal game lasts at most 9 moves and always ends by termination at the 9th, so the
default ``max_steps_in_episode = 9`` never fires. With a smaller limit, a game still
running after that many moves is truncated for both agents (``truncated`` is set only
for agents that are not terminated at that step). Once the game is over, further
``step`` calls change nothing and report the same flags, reward 0 and nobody acting.

Observation of agent ``i`` (float32 ``[27]``, values 0/1, from ``i``'s point of view):
``[own marks (9 cells), opponent's marks (9), empty cells (9)]``. The last 9 entries
are the legal-action mask, so a policy that only sees observations can mask illegal
moves. Both agents get their observation every step (only the mover's is used).

``info`` is :class:`TicTacToeInfo` with ``action_mask: bool[2, 9]``, the empty cells
(the same row for both agents; all False once the board is full). In rollout buffers,
``infos[t]`` belongs to ``obs[t + 1]`` (the step's result): it masks the action of
step ``t + 1``. ``transforms=(ActionMaskFromInfo(),)`` turns it into a masked
observation for the policy.

``TicTacToe(masked_obs=True)`` (``js.make("TicTacToe-v0", masked_obs=True)``) publishes
the masked observation itself: ``Dict(observations=Box[27], action_mask=bool Box[9])``
(the same mask as ``info``), which masking policies read directly.

``render`` draws the board as a 120 x 120 frame (see :meth:`TicTacToe.render`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxsampler.envs import render as draw
from jaxsampler.envs.base import MultiAgentEnv
from jaxsampler.spaces import Box, Dict, Discrete, Space

__all__ = ["TicTacToe", "TicTacToeInfo", "TicTacToeMove", "TicTacToeParams", "TicTacToeState"]

# The 8 winning lines (rows, columns, diagonals) as cell indices.
_LINES = np.array(
    [[0, 1, 2], [3, 4, 5], [6, 7, 8], [0, 3, 6], [1, 4, 7], [2, 5, 8], [0, 4, 8], [2, 4, 6]],
    np.int32,
)


#: Frame size ``(H, W)`` of :meth:`TicTacToe.render`; each cell is a 40 px square.
RENDER_SHAPE = (120, 120)
_CELL_PX = 40
_X_COLOR: draw.Color = draw.RED
_O_COLOR: draw.Color = draw.BLUE


@struct.dataclass
class TicTacToeState:
    board: jax.Array  # int32[9]: 0 empty, 1 X (agent_0), 2 O (agent_1)
    player: jax.Array  # int32[], agent on turn (0 or 1)
    terminated: jax.Array  # bool[2], sticky
    truncated: jax.Array  # bool[2], sticky
    time: jax.Array  # int32[], moves made


@struct.dataclass
class TicTacToeParams:
    max_steps_in_episode: int = 9


@struct.dataclass
class TicTacToeInfo:
    """``action_mask: bool[2, 9]``: cells that are empty (legal moves), per agent row."""

    action_mask: jax.Array


@struct.dataclass
class TicTacToeMove:
    """What one step did, read by both agents' rewards."""

    live: jax.Array  # bool[], the game was still on
    mover: jax.Array  # int32[], the agent that was on turn
    mover_reward: jax.Array  # float32[], its reward (the opponent gets the negation)


@dataclasses.dataclass(frozen=True)
class TicTacToe(MultiAgentEnv):
    """``TicTacToe()``: two-player tic-tac-toe; the loser of an illegal move is the mover.

    Args:
        masked_obs: observations are ``{"observations": float32[27], "action_mask":
            bool[9]}`` (the legal moves) instead of the plain ``float32[27]``.
    """

    masked_obs: bool = False

    num_agents: ClassVar[int] = 2
    max_acting: ClassVar[int | None] = 1  # one player moves per step
    agents_end_together: ClassVar[bool] = True  # (the game ends for both players)

    @property
    def name(self) -> str:
        """``"TicTacToe-v0"``."""
        return "TicTacToe-v0"

    @property
    def default_params(self) -> TicTacToeParams:
        """:class:`TicTacToeParams` with a 9-move limit, which a legal game never reaches."""
        return TicTacToeParams()

    @property
    def observation_space(self) -> Space:
        """``float32[27]`` of 0/1 (own marks, opponent's marks, empty cells); with
        ``masked_obs``, a ``Dict`` of it and the ``bool[9]`` action mask."""
        board = Box(0.0, 1.0, (27,), np.float32)
        if self.masked_obs:
            return Dict({"observations": board, "action_mask": Box(0, 1, (9,), np.bool_)})
        return board

    @property
    def action_space(self) -> Discrete:
        """``Discrete(9)``: the cell ``row * 3 + col``."""
        return Discrete(9)

    def reset_world(self, key: jax.Array, params: TicTacToeParams) -> TicTacToeState:
        """An empty board, X (agent 0) on turn. ``key`` is unused (the start is fixed)."""
        return TicTacToeState(
            board=jnp.zeros((9,), jnp.int32),
            player=jnp.zeros((), jnp.int32),
            terminated=jnp.zeros((2,), jnp.bool_),
            truncated=jnp.zeros((2,), jnp.bool_),
            time=jnp.zeros((), jnp.int32),
        )

    def step_world(
        self,
        key: jax.Array,
        state: TicTacToeState,
        action: jax.Array,
        params: TicTacToeParams,
    ) -> tuple[TicTacToeState, TicTacToeMove]:
        """Plays ``action[state.player]`` (``int[2]``; the other entry is ignored).

        A cell outside ``0..8`` is clipped into that range. Deterministic (``key`` is
        unused). The shared part is a :class:`TicTacToeMove`.
        """
        live = ~jnp.any(state.terminated | state.truncated)
        cell = jnp.clip(jnp.asarray(action, jnp.int32)[state.player], 0, 8)
        legal = state.board[cell] == 0
        mark = state.player + 1
        board = jnp.where(live & legal, state.board.at[cell].set(mark), state.board)
        won = jnp.any(jnp.all(board[_LINES] == mark, axis=-1))
        full = jnp.all(board != 0)
        # +1 for the mover when it wins, -1 when it moved illegally, 0 otherwise (draw, play on).
        mover_reward = jnp.where(legal, jnp.where(won, 1.0, 0.0), -1.0)
        over = live & (~legal | won | full)
        time = state.time + live.astype(jnp.int32)
        terminated = state.terminated | over
        truncated = state.truncated | (live & ~over & (time >= params.max_steps_in_episode))
        s = TicTacToeState(
            board=board,
            player=jnp.where(live & ~over, 1 - state.player, state.player),
            terminated=terminated,
            truncated=truncated,
            time=time,
        )
        return s, TicTacToeMove(live=live, mover=state.player, mover_reward=mover_reward)

    @property
    def render_shape(self) -> tuple[int, int]:
        """``(120, 120)``, known statically (no tracing)."""
        return RENDER_SHAPE

    def render(self, state: TicTacToeState, params: TicTacToeParams | None = None) -> jax.Array:
        """The board: ``uint8[120, 120, 3]``. Pure; jit/vmap-safe.

        Cell ``row * 3 + col`` is the 40 px square at rows ``40 row ..`` and columns
        ``40 col ..``, separated by dark gray lines 2 px wide. X (agent_0) is a red
        cross, O (agent_1) a blue ring, both within 12 px of the cell's center. Once the
        game is over the background turns light gray.
        """
        shape = RENDER_SHAPE
        xs, ys = draw.pixel_centers(shape)
        col = jnp.clip(xs // _CELL_PX, 0, 2).astype(jnp.int32)  # [1, W]
        row = jnp.clip(ys // _CELL_PX, 0, 2).astype(jnp.int32)  # [H, 1]
        mark = state.board[row * 3 + col]  # [H, W]
        u = xs - (col + 0.5) * _CELL_PX  # offsets from the cell's center
        v = ys - (row + 0.5) * _CELL_PX
        near = (jnp.abs(u) <= 12.0) & (jnp.abs(v) <= 12.0)
        cross = near & ((jnp.abs(u - v) <= 3.0) | (jnp.abs(u + v) <= 3.0))
        r2 = u * u + v * v
        ring = (r2 <= 12.0**2) & (r2 >= 8.0**2)
        over = jnp.any(state.terminated | state.truncated)
        lines = jnp.zeros(shape, jnp.bool_)
        for k in (1, 2):
            edge = k * _CELL_PX
            lines |= jnp.abs(xs - edge) <= 1.0
            lines |= jnp.abs(ys - edge) <= 1.0
        layers = [
            (jnp.broadcast_to(over, shape), draw.LIGHT_GRAY),
            (lines, draw.DARK_GRAY),
            (cross & (mark == 1), _X_COLOR),
            (ring & (mark == 2), _O_COLOR),
        ]
        return draw.compose(shape, layers, draw.WHITE)

    def agent_rows(self, state: TicTacToeState) -> tuple[jax.Array, jax.Array]:
        """TicTacToe's per-agent rows: the sticky ``(terminated, truncated)`` flags, ``bool[2]``
        each."""
        return state.terminated, state.truncated  # own = (terminated, truncated)

    def agent_obs(
        self, agent_id: jax.Array, own: Any, state: TicTacToeState, params: TicTacToeParams
    ) -> jax.Array | dict[str, jax.Array]:
        """``[own marks, opponent's marks, empty cells]`` from ``agent_id``'s side (with
        ``masked_obs``, as ``"observations"`` next to the ``"action_mask"``)."""
        mine, opponent = state.board == agent_id + 1, state.board == 2 - agent_id
        board = jnp.concatenate([mine, opponent, state.board == 0]).astype(jnp.float32)
        if self.masked_obs:
            return {"observations": board, "action_mask": state.board == 0}
        return board

    def agent_reward(
        self,
        agent_id: jax.Array,
        own: Any,
        state: TicTacToeState,
        shared: TicTacToeMove,
        params: TicTacToeParams,
    ) -> jax.Array:
        """``shared.mover_reward`` (:class:`TicTacToeMove`) for the mover, its negation for
        the opponent; 0 for both if the game was already over before the step."""
        mine = jnp.where(agent_id == shared.mover, shared.mover_reward, 0.0 - shared.mover_reward)
        return jnp.where(shared.live, mine, 0.0)  # 0.0 - x above: no -0.0

    def agent_terminated(
        self, agent_id: jax.Array, own: Any, state: TicTacToeState, params: TicTacToeParams
    ) -> jax.Array:
        """The sticky flag (``own[0]``), set for both agents when the game ends (a win, a draw
        or an illegal move)."""
        return own[0]

    def agent_truncated(
        self, agent_id: jax.Array, own: Any, state: TicTacToeState, params: TicTacToeParams
    ) -> jax.Array:
        """The sticky flag (``own[1]``), set at the move limit while the game is still on."""
        return own[1]

    def agent_acting(
        self, agent_id: jax.Array, own: Any, state: TicTacToeState, params: TicTacToeParams
    ) -> jax.Array:
        """True only for the agent on turn, and only while the game is on."""
        terminated, truncated = own
        return (agent_id == state.player) & ~(terminated | truncated)

    def info(self, state: TicTacToeState, params: TicTacToeParams) -> TicTacToeInfo:
        """:class:`TicTacToeInfo`: the empty cells as ``action_mask``, the same row for both
        agents (``bool[2, 9]``)."""
        return TicTacToeInfo(jnp.broadcast_to(state.board == 0, (2, 9)))
