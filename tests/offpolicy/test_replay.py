"""Real flashbax buffers filled from real rollouts (CartPole with a short time limit:
terminations and truncations; TicTacToe: two agents out of lockstep), checked against a
plain-Python reconstruction of the transitions and steps from the Trajectory."""

from __future__ import annotations

import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.offpolicy import (
    make_sequence_buffer,
    make_transition_buffer,
    replay_policy_states,
    transitions,
)
from tests.offpolicy import reference

T = 16


def _rollouts(env, pol, params, env_params, num_envs, calls=2):
    rollout = js.make_rollout(env, pol, num_envs, T)
    state = js.init_rollout_state(env, pol, num_envs, jax.random.PRNGKey(1), env_params=env_params)
    run = jax.jit(rollout)
    trajs = []
    for _ in range(calls):
        state, traj = run(params, state)
        trajs.append(traj)
    return rollout, params, state, trajs


@pytest.fixture(scope="module")
def cartpole():
    env = js.make("CartPole-v1")
    pol = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(8,))
    params = pol.init(jax.random.PRNGKey(0))
    return _rollouts(env, pol, params, env.default_params.replace(max_steps_in_episode=12), 3)


@pytest.fixture(scope="module")
def tictactoe():
    env = js.make("TicTacToe-v0")
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    return _rollouts(env, pol, (), env.default_params.replace(max_steps_in_episode=3), 2)


def _np(tree):
    return jax.tree.map(np.asarray, tree)


def _assert_boundaries(trajs):
    term = np.concatenate([np.asarray(t.terminated) for t in trajs])
    trunc = np.concatenate([np.asarray(t.truncated) for t in trajs])
    reset = np.concatenate([np.asarray(t.is_reset) for t in trajs])
    assert term.any() and trunc.any() and reset.any()


def _rows_mask(ref, field):
    """Where a field is specified: everywhere, but ``next_obs`` only on valid rows."""
    valid = ref["valid"].reshape(ref["valid"].shape + (1,) * (ref[field].ndim - 2))
    return valid if field == "next_obs" else np.ones_like(valid)


FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated", "valid")


@pytest.mark.parametrize("name", ["cartpole", "tictactoe"])
def test_transitions_match_the_reconstruction(name, request):
    _, _, _, trajs = request.getfixturevalue(name)
    _assert_boundaries(trajs)
    for traj in trajs:
        ours, ref = _np(jax.jit(transitions)(traj)), reference.transition_rows(traj)
        for f in FIELDS:  # next_obs of invalid rows is unspecified
            got = np.where(_rows_mask(ref, f), getattr(ours, f), ref[f])
            np.testing.assert_allclose(got, ref[f], rtol=1e-6, err_msg=f)
        E, A = traj.num_envs, traj.num_agents
        for k, v in traj.extras.items():
            np.testing.assert_array_equal(
                ours.extras[k], np.asarray(v).swapaxes(0, 1).reshape((E * A, T) + v.shape[3:])
            )
        # reset rows and waiting agents are left out
        reset_rows = np.repeat(np.asarray(traj.is_reset).T, A, axis=0)
        assert not ours.valid[reset_rows].any()
        if A > 1:
            assert (~ours.valid & ~reset_rows).any()


def test_episode_ends_read_the_real_final_observation(cartpole):
    _, _, _, trajs = cartpole
    traj = trajs[0]
    tr = _np(transitions(traj))
    obs, is_reset = np.asarray(traj.obs), np.asarray(traj.is_reset)
    ends = np.argwhere(tr.valid & (tr.terminated | tr.truncated))
    assert len(ends) > 0 and tr.truncated[tr.valid].any()
    for row, t in ends:
        if t + 1 < T:
            assert is_reset[t + 1, row]  # the next slot is the reset step's ...
            np.testing.assert_array_equal(tr.next_obs[row, t], obs[t + 1, row, 0])
            # ... which holds the final observation, not the next episode's first one
            assert not np.array_equal(tr.next_obs[row, t], obs[t + 2, row, 0])


@pytest.mark.parametrize(
    "name, kind", [("cartpole", "item"), ("cartpole", "flat"), ("tictactoe", "item")]
)
def test_transition_buffer_holds_and_samples_the_transitions(name, kind, request):
    rollout, params, state, trajs = request.getfixturevalue(name)
    replay = make_transition_buffer(trajs[0], 4096, 8, 64, kind=kind)

    @jax.jit
    def fill(key):
        buf = replay.init()
        for traj in trajs:
            buf = replay.add(buf, traj)
        return buf, replay.sample(buf, key), replay.can_sample(buf)

    buf, sample, ok = _np(fill(jax.random.PRNGKey(3)))
    assert ok
    refs = [reference.transition_rows(t) for t in trajs]
    rows = trajs[0].num_envs * trajs[0].num_agents
    for f in FIELDS:
        stored = getattr(buf.experience, f)
        if kind == "item":  # one row: each add's [rows, T] flattened row-major
            got = stored[0, : 2 * rows * T].reshape((2, rows, T) + stored.shape[2:])
            want = np.stack([r[f] for r in refs])
        else:  # rows kept, the two adds one after the other in time
            got = stored[:, : 2 * T]
            want = np.concatenate([r[f] for r in refs], axis=1)
        if f == "next_obs":
            valid = np.stack([r["valid"] for r in refs]) if kind == "item" else None
            if valid is None:
                valid = np.concatenate([r["valid"] for r in refs], axis=1)
            got = np.where(valid[..., None], got, want)
        np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f)
    known = {
        tuple(np.concatenate([np.ravel(r[f][i, t]) for f in FIELDS]).tolist())
        for r in refs
        for i in range(rows)
        for t in range(T)
    }
    for s in range(sample.valid.shape[0]):
        if sample.valid[s]:  # invalid rows' next_obs is unspecified
            item = np.concatenate([np.ravel(getattr(sample, f)[s]) for f in FIELDS])
            assert tuple(item.tolist()) in known
    assert sample.valid.any()


def _find_window(rows_obs, window_obs):
    """(row, start) of the window in the reference timelines (unique for CartPole's obs)."""
    L = window_obs.shape[0]
    hits = [
        (r, t)
        for r in range(rows_obs.shape[0])
        for t in range(rows_obs.shape[1] - L + 1)
        if np.array_equal(rows_obs[r, t : t + L], window_obs)
    ]
    assert len(hits) == 1
    return hits[0]


@pytest.mark.parametrize("cross", [False, True])
def test_sequence_buffer_windows_and_masks(cartpole, cross):
    _, _, _, trajs = cartpole
    L = 5
    replay = make_sequence_buffer(trajs[0], L, 64, L, 48, cross_episodes=cross)

    @jax.jit
    def fill(key):
        buf = replay.init()
        for traj in trajs:
            buf = replay.add(buf, traj)
        return buf, replay.sample(buf, key)

    buf, sample = _np(fill(jax.random.PRNGKey(4)))
    refs = [reference.step_rows(t) for t in trajs]
    ref = {k: np.concatenate([r[k] for r in refs], axis=1) for k in refs[0]}
    for k, want in ref.items():
        np.testing.assert_allclose(getattr(buf.experience, k)[:, : 2 * T], want, err_msg=k)
    crossed = 0
    for s in range(sample.mask.shape[0]):
        row, t = _find_window(ref["obs"], sample.steps.obs[s])
        ids = ref["episode_id"][row, t : t + L]
        for k in ("reward", "valid", "episode_start"):
            np.testing.assert_array_equal(getattr(sample.steps, k)[s], ref[k][row, t : t + L])
        want_mask = np.ones(L, bool) if cross else ids == ids[0]
        np.testing.assert_array_equal(sample.mask[s], want_mask)
        crossed += int(len(set(ids.tolist())) > 1)
    assert crossed > 0  # some windows ran into the next episode


@pytest.fixture(scope="module")
def recurrent():
    env = js.make("CartPole-v1")
    pol = js.policies.RecurrentPolicy(env.observation_space, env.action_space, hidden_size=4)
    params = pol.init(jax.random.PRNGKey(0))
    env_params = env.default_params.replace(max_steps_in_episode=5)
    return pol, _rollouts(env, pol, params, env_params, 2)


def test_replayed_policy_states_match_the_rollouts(recurrent):
    pol, (_, params, end_state, trajs) = recurrent
    replay = jax.jit(replay_policy_states, static_argnums=0)
    states = [np.asarray(replay(pol, params, t)) for t in trajs]
    for traj, st in zip(trajs, states, strict=True):
        keep = np.asarray(traj.episode_step_0) != 0  # else reset to zeros at step 0
        np.testing.assert_array_equal(st[0][keep], np.asarray(traj.policy_state_0)[keep])
        assert np.all(st[0][~keep] == 0)
    # after call k's last step the policy holds call k + 1's starting state
    nexts = [trajs[1].policy_state_0, end_state.policy_state]
    for traj, st, nxt in zip(trajs, states, nexts, strict=True):
        last_obs = jax.tree.map(lambda x: x[T - 1], traj.obs)
        carry = pol(params, last_obs, jax.random.PRNGKey(0), jnp.asarray(st[T - 1]))[2]
        np.testing.assert_allclose(np.asarray(carry), np.asarray(nxt), rtol=1e-5, atol=1e-6)


def test_sequence_buffer_stores_the_state_at_each_window_start(recurrent):
    pol, (_, params, _, trajs) = recurrent
    states = [replay_policy_states(pol, params, t) for t in trajs]
    replay = make_sequence_buffer(trajs[0], 4, 64, 4, 16, policy_states=states[0])

    @jax.jit
    def fill(key):
        buf = replay.init()
        for traj, st in zip(trajs, states, strict=True):
            buf = replay.add(buf, traj, st)
        return replay.sample(buf, key)

    sample = _np(fill(jax.random.PRNGKey(5)))
    ref_obs = np.concatenate([reference.step_rows(t)["obs"] for t in trajs], axis=1)
    E = trajs[0].num_envs
    ref_states = np.concatenate(
        [np.asarray(s).swapaxes(0, 1).reshape(E, T, -1) for s in states], axis=1
    )
    for s in range(sample.mask.shape[0]):
        row, t = _find_window(ref_obs, sample.steps.obs[s])
        np.testing.assert_array_equal(sample.steps.policy_state[s, 0], ref_states[row, t])


def test_no_retrace_on_repeated_adds(cartpole):
    _, _, _, trajs = cartpole
    replay = make_transition_buffer(trajs[0], 1024, 8, 16)

    @jax.jit
    @chex.assert_max_traces(n=1)
    def step(buf, traj, key):
        buf = replay.add(buf, traj)
        return buf, replay.sample(buf, key)

    buf = replay.init()
    for i, traj in enumerate(trajs * 2):
        buf, _ = step(buf, traj, jax.random.PRNGKey(i))
    assert int(buf.current_index) == 4 * trajs[0].num_envs * T


# --- bad input -------------------------------------------------------------------------


def test_a_trajectory_of_other_shapes_is_named_with_both(cartpole, tictactoe):
    _, _, _, trajs = cartpole
    replay = make_transition_buffer(trajs[0], 256, 8, 8, kind="flat")
    buf = replay.init()
    other = trajs[0].replace(obs=trajs[0].obs[..., :3])
    with pytest.raises(
        ValueError, match=r"field \.obs has shape \(3, 16, 3\).*buffer's is \(3, 85, 4\)"
    ):
        jax.jit(replay.add)(buf, other)
    fewer_envs = jax.tree.map(lambda x: x[:, :2] if x.ndim > 1 else x[:2], trajs[0])
    with pytest.raises(ValueError, match=r"has shape \(2, 16.*buffer's is \(3, 85"):
        replay.add(buf, fewer_envs)
    with pytest.raises(TypeError, match="field .obs has dtype float16, the buffer's is float32"):
        replay.add(buf, trajs[0].replace(obs=trajs[0].obs.astype(jnp.float16)))
    seq = make_sequence_buffer(trajs[0], 4, 64, 4, 8)
    with pytest.raises(ValueError, match="do not match the buffer's structure"):
        seq.add(seq.init(), trajs[0], jax.tree.map(lambda x: x[..., None], trajs[0].rewards))
    _, _, _, ttt = tictactoe
    with pytest.raises(
        ValueError, match=r"structure:\n  trajectory: .*\{\}.*\n  buffer: .*vf_preds"
    ):
        make_transition_buffer(trajs[0], 256, 8, 8).add(replay.init(), ttt[0])


def test_a_sequence_longer_than_the_rollout_is_a_value_error(cartpole):
    _, _, _, trajs = cartpole
    with pytest.raises(ValueError, match="sequence_length 17 is longer than the rollout"):
        make_sequence_buffer(trajs[0], T + 1, 64, 4, 8)
    seq = make_sequence_buffer(trajs[0], 8, 64, 8, 8)
    short = jax.tree.map(lambda x: x[:5], trajs[0])
    short = short.replace(
        obs=trajs[0].obs[:6],
        episode_count_0=trajs[0].episode_count_0,
        episode_step_0=trajs[0].episode_step_0,
        policy_state_0=trajs[0].policy_state_0,
    )
    with pytest.raises(ValueError, match="sequence_length 8 is longer than the rollout"):
        seq.add(seq.init(), short)
    with pytest.raises(ValueError, match="kind must be one of"):
        make_transition_buffer(trajs[0], 256, 8, 8, kind="prioritised")


def test_a_missing_extra_names_the_install_command(cartpole, monkeypatch):
    _, _, _, trajs = cartpole
    monkeypatch.setitem(sys.modules, "flashbax", None)
    with pytest.raises(ImportError, match=r"pip install jaxsampler\[offpolicy\]"):
        make_transition_buffer(trajs[0], 256, 8, 8)
    monkeypatch.setitem(sys.modules, "rlax", None)
    r = np.zeros((2, 1, 1), np.float32)
    f = np.zeros((2, 1, 1), bool)
    with pytest.raises(ImportError, match=r"needs rlax: pip install jaxsampler\[offpolicy\]"):
        js.offpolicy.vtrace(r, r, r, r, f, f, f, f[..., 0], r[0])


def test_jaxsampler_imports_without_the_extra():
    code = (
        "import sys; sys.modules['flashbax'] = None; sys.modules['rlax'] = None\n"
        "import jaxsampler as js\n"
        "assert js.offpolicy.n_step_targets\n"
        "assert 'flashbax' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_docs_example_runs():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "training.md").read_text()
    block = text.split("## Off-policy", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    scope: dict = {}
    exec(compile(block, "docs/guides/training.md (off-policy)", "exec"), scope)
    batch = scope["batch"]
    assert batch.obs.shape == batch.next_obs.shape == (64, 4)
