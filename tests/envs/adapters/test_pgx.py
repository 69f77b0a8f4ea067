"""pgx adapter: bit-exact against pgx's own init/step driven by hand, check_env, RLlib-style
crediting of the waiting player's rewards, masked play, bad input."""

from __future__ import annotations

import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsampler as js

pgx = pytest.importorskip("pgx", reason="pgx is not installed (pip install -e '.[pgx]')")

from jaxsampler.envs.adapters.pgx import PgxEnv, PgxParams, from_pgx, make_pgx  # noqa: E402


def _observe_all(env, state, num_players):
    """Every player's observation, pgx's own observe called once per player id."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return np.stack([np.asarray(env.observe(state, jnp.int32(i))) for i in range(num_players)])


@pytest.mark.parametrize(
    "env_id, max_moves",
    [
        ("tic_tac_toe", 12),
        ("connect_four", 45),
        pytest.param("2048", 25, marks=pytest.mark.slow),  # ~14 s: pgx's 2048 compiles slowly
    ],
)
def test_bit_exact_against_pgx_driven_by_hand(env_id, max_moves):
    """Same keys, same moves: the adapter reports exactly pgx's state, for every player."""
    game = pgx.make(env_id)
    env = js.make(f"pgx:{env_id}")
    A = game.num_players
    assert env.num_agents == A and env.action_space == js.spaces.Discrete(game.num_actions)
    init, step = jax.jit(game.init), jax.jit(game.step)
    reset_a, step_a = jax.jit(env.reset), jax.jit(env.step)
    rng = np.random.default_rng(0)
    key = jax.random.PRNGKey(3)
    key, k = jax.random.split(key)
    ref = init(k)
    state, ts = reset_a(k)
    for t in range(max_moves):
        obs = _observe_all(game, ref, A)
        np.testing.assert_array_equal(ts.obs["observations"], obs, err_msg=f"{env_id} {t}")
        cp = int(ref.current_player)
        if not bool(ref.terminated):  # pgx's own observation is the current player's
            np.testing.assert_array_equal(obs[cp], np.asarray(ref.observation))
        np.testing.assert_array_equal(
            ts.obs["action_mask"], np.broadcast_to(ref.legal_action_mask, (A, game.num_actions))
        )
        np.testing.assert_array_equal(ts.reward, np.asarray(ref.rewards, np.float32))
        np.testing.assert_array_equal(ts.terminated, np.full(A, bool(ref.terminated)))
        np.testing.assert_array_equal(ts.truncated, np.full(A, bool(ref.truncated)))
        done = bool(ref.terminated | ref.truncated)
        np.testing.assert_array_equal(ts.acting, (np.arange(A) == cp) & ~done)
        if done:
            break
        legal = np.flatnonzero(np.asarray(ref.legal_action_mask))
        move = int(rng.choice(legal))
        # the waiting players' entries are junk: they must be ignored
        action = np.where(np.arange(A) == cp, move, rng.integers(game.num_actions, size=A))
        key, k = jax.random.split(key)
        ref = step(ref, jnp.int32(move), k)
        state, ts = step_a(k, state, jnp.asarray(action, jnp.int32))
    assert done or env_id == "2048", f"{env_id} did not end within {max_moves} moves"


@pytest.mark.slow  # ~12 s
def test_check_env_passes():
    env = js.make("pgx:tic_tac_toe")
    report = js.check_env(env, num_envs=4)
    assert report.ok, str(report)


def test_single_player_game_is_one_agent_and_time_limit_truncates():
    env = js.make("pgx:2048", params=PgxParams(max_steps_in_episode=3), masked_obs=False)
    assert env.num_agents == 1 and len(env.agent_ids) == 1
    assert env.observation_space.shape == pgx.make("2048").observation_shape
    state, ts = env.reset(jax.random.PRNGKey(0))
    assert ts.acting.tolist() == [True] and ts.obs.shape == (1, 4, 4, 31)
    flags = []
    for t in range(3):
        legal = np.flatnonzero(np.asarray(state.legal_action_mask))
        state, ts = env.step(jax.random.PRNGKey(t), state, jnp.asarray([legal[0]], jnp.int32))
        flags.append((bool(ts.truncated[0]), bool(ts.acting[0])))
    assert flags == [(False, True), (False, True), (True, False)]


def _first_mover(sa_episode) -> bool:
    """Whether an agent moved first: its first tic-tac-toe observation has no mark on it."""
    first = sa_episode.get_observations(0)
    return not np.asarray(first["observations"]).any()


def test_episode_returns_credit_the_waiting_players_rewards_as_pgx_does():
    """Per-agent returns of the sampler's episodes equal pgx's cumulative rewards of a game
    replayed by hand from the episodes' moves (the loser's -1 arrives while it waits)."""
    env = js.make("pgx:tic_tac_toe")
    game = pgx.make("tic_tac_toe")
    init, step = jax.jit(game.init), jax.jit(game.step)
    policy = js.RandomPolicy(env.observation_space, env.action_space)
    sampler = js.Sampler(env, policy, num_envs=4, rollout_length=16, seed=5)
    checked = nonzero_waiting = 0
    for _ in range(2):
        for ep in sampler.sample(()):
            if not ep.is_done or ep.env_t_started != 0:
                continue
            eps = [ep.agent_episodes[a] for a in ("agent_0", "agent_1")]
            first = 0 if _first_mover(eps[0]) else 1
            assert _first_mover(eps[first]) and not _first_mover(eps[1 - first])
            # a start where pgx's player `first` moves (pgx draws the first player from the key)
            ref = next(
                s
                for s in (init(jax.random.PRNGKey(i)) for i in range(20))
                if int(s.current_player) == first
            )
            moves = [np.asarray(e.get_actions()).tolist() for e in eps]
            total = np.zeros(2, np.float32)
            order = [first, 1 - first]
            for t in range(len(moves[0]) + len(moves[1])):
                player = order[t % 2]
                assert int(ref.current_player) == player
                ref = step(ref, jnp.int32(moves[player][t // 2]), jax.random.PRNGKey(t))
                total += np.asarray(ref.rewards)
            assert bool(ref.terminated)
            for i in range(2):
                assert eps[i].get_return() == pytest.approx(float(total[i]))
            last_mover = order[(len(moves[0]) + len(moves[1]) - 1) % 2]
            nonzero_waiting += total[1 - last_mover] != 0
            checked += 1
    assert checked >= 4 and nonzero_waiting >= 1  # some game credits the waiting loser


@pytest.mark.parametrize("kind", ["random", "mlp"])
def test_masking_policies_play_only_legal_moves(kind):
    env = js.make("pgx:connect_four")
    space = env.observation_space
    if kind == "random":
        policy, params = js.RandomPolicy(space, env.action_space), ()
    else:
        policy = js.MLPPolicy(space, env.action_space, (16,))
        params = policy.init(jax.random.PRNGKey(0))
    rollout = js.make_rollout(env, policy, 4, 60)
    _, traj = jax.jit(lambda key: rollout(params, js.init_rollout_state(env, policy, 4, key)))(
        jax.random.PRNGKey(1)
    )
    mask = np.asarray(traj.obs["action_mask"][:-1])  # [T, E, A, 7]
    actions, acting = np.asarray(traj.actions), np.asarray(traj.acting)
    legal = np.take_along_axis(mask, actions[..., None], -1)[..., 0]
    assert acting.sum() > 100 and legal[acting].all()
    # pgx punishes an illegal move with -1 to the mover at once: never happened
    done = np.asarray(traj.terminated).all(-1)
    assert done.sum() >= 1


def test_bad_input():
    with pytest.raises(ValueError, match="tic_tac_toe") as e:
        js.make("pgx:nope")
    assert "unknown pgx env id 'nope'" in str(e.value)
    with pytest.raises(ValueError, match="Did you mean 'pgx:connect_four'"):
        make_pgx("connect_fuor")
    with pytest.raises(TypeError, match="from_pgx expected a pgx.Env"):
        from_pgx(object())
    with pytest.raises(TypeError, match="needs no adapter"):
        js.envs.from_pgx(js.make("CartPole-v1"))


def test_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pgx", None)  # import pgx -> ImportError
    with pytest.raises(ImportError, match=r'pip install -e "\.\[pgx\]"'):
        make_pgx("tic_tac_toe")


def test_identity_and_plain_observations():
    game = pgx.make("tic_tac_toe")
    a, b = from_pgx(game), from_pgx(game)
    assert a == b and hash(a) == hash(b) and a.name == "pgx:tic_tac_toe"
    plain = from_pgx(game, masked_obs=False)
    assert plain != a and isinstance(plain, PgxEnv)
    assert plain.observation_space == js.spaces.Box(0, 1, (3, 3, 2), np.bool_)
    _, ts = plain.reset(jax.random.PRNGKey(0))
    assert ts.obs.shape == (2, 3, 3, 2) and ts.obs.dtype == jnp.bool_
