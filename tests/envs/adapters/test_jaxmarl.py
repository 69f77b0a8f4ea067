"""The JaxMARL adapter: a fake dict-API env written here, and the real jaxmarl if installed."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

import jaxsampler as js
from jaxsampler.envs.adapters.jaxmarl import JaxMARLParams, convert_jaxmarl_space, from_jaxmarl


class Discrete:  # the attributes JaxMARL's spaces have; duck-typed by the adapter
    def __init__(self, n):
        self.n, self.shape, self.dtype = n, (), jnp.int32


class Box:
    def __init__(self, low, high, shape, dtype=jnp.float32):
        self.low, self.high, self.shape, self.dtype = low, high, shape, dtype


@struct.dataclass
class CounterState:
    count: jax.Array  # float32[2]
    step: jax.Array  # int32[]
    resets: jax.Array  # int32[], how many times the env reset itself (never, via step_env)


@dataclasses.dataclass(frozen=True)
class FakeCounters:
    """Two agents in lockstep; each adds its action (0, 1, 2) to its own counter.

    ``agent`` ``"bob"`` is done at count >= 3, ``"alice"`` at count >= 5; ``"__all__"`` when
    both are or after ``max_steps`` steps. Reward: the action taken. Observation of agent i:
    ``[own count, other count, step]``. Its ``step`` resets internally, like JaxMARL's.
    """

    max_steps: int = 20
    obs_dim: int = 3
    agents: tuple = ("bob", "alice")
    num_agents: int = 2

    def observation_space(self, agent):
        return Box(-np.inf, np.inf, (self.obs_dim if agent == "bob" else 3,))

    def action_space(self, agent):
        return Discrete(3)

    def _obs(self, s):
        c = s.count
        t = s.step.astype(jnp.float32)
        return {"bob": jnp.stack([c[0], c[1], t]), "alice": jnp.stack([c[1], c[0], t])}

    def reset(self, key):
        s = CounterState(
            jnp.zeros(2, jnp.float32), jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32)
        )
        return self._obs(s), s

    def step_env(self, key, state, actions):
        a = jnp.stack([actions["bob"], actions["alice"]]).astype(jnp.float32)
        s = state.replace(count=state.count + a, step=state.step + 1)
        done = s.count >= jnp.array([3.0, 5.0])
        dones = {
            "bob": done[0],
            "alice": done[1],
            "__all__": done.all() | (s.step >= self.max_steps),
        }
        rewards = {"bob": a[0], "alice": a[1]}
        return self._obs(s), s, rewards, dones, {"count_sum": s.count.sum()}

    def step(self, key, state, actions):
        obs, s, r, d, info = self.step_env(key, state, actions)
        obs_re, s_re = self.reset(key)
        s_re = s_re.replace(resets=state.resets + 1)

        def pick(x, y):
            return jnp.where(d["__all__"], x, y)

        return jax.tree.map(pick, obs_re, obs), jax.tree.map(pick, s_re, s), r, d, info


def env_slice(tree, e: int):
    """Env ``e`` of a batched pytree."""
    return jax.tree.map(lambda x: x[e], tree)


FAKE = FakeCounters()
ENV = from_jaxmarl(FAKE, env_id="counters")
RESET, STEP = jax.jit(ENV.reset), jax.jit(ENV.step)


def test_spaces_names_and_layout():
    assert (
        ENV.num_agents == 2 and ENV.agent_ids == ("bob", "alice") and ENV.name == "jaxmarl:counters"
    )
    assert ENV.observation_space == js.spaces.Box(-np.inf, np.inf, (3,))
    assert ENV.action_space == js.spaces.Discrete(3)
    assert from_jaxmarl(FAKE, env_id="counters") == ENV and hash(ENV) == hash(
        from_jaxmarl(FAKE, env_id="counters")
    )
    assert from_jaxmarl(FAKE, JaxMARLParams(max_steps_in_episode=5), "counters") != ENV
    _, ts = RESET(jax.random.PRNGKey(0))
    assert ts.obs.shape == (2, 3) and ts.acting.all() and not ts.terminated.any()
    assert float(ts.info["count_sum"]) == 0.0  # zeros of the step's info structure


def test_sticky_done_agents_and_episode_end():
    s, ts = RESET(jax.random.PRNGKey(0))
    # Bob adds 2 per step (done after step 2), Alice 1 (done after step 5).
    for t in range(1, 8):
        prev = ts
        s, ts = STEP(jax.random.PRNGKey(t), s, jnp.array([2, 1], jnp.int32))
        bob_done, alice_done = t >= 2, t >= 5
        np.testing.assert_array_equal(ts.terminated, [bob_done, alice_done])
        assert not ts.truncated.any()
        np.testing.assert_array_equal(ts.acting, [not bob_done, not alice_done])
        np.testing.assert_array_equal(ts.reward, [2.0 * (t <= 2), 1.0 * (t <= 5)])
        if t > 2:  # Bob's observation is frozen at the step he finished
            np.testing.assert_array_equal(ts.obs[0], prev.obs[0])
        if t <= 5:  # Alice's observation is live (stacked in env.agents order)
            # Bob's action still reaches the wrapped env after he is done (lockstep API).
            np.testing.assert_array_equal(ts.obs[1], [t, 2 * t, t])
    assert int(s.env_state.resets) == 0  # step_env was used: no hidden reset
    np.testing.assert_array_equal(
        ts.obs[1], [5, 10, 5]
    )  # the real final observation, not a reset one


def test_done_all_terminates_everyone_and_time_limit_truncates():
    short = from_jaxmarl(FakeCounters(max_steps=3))  # "__all__" after 3 steps, Alice not done
    step = jax.jit(short.step)
    s, ts = jax.jit(short.reset)(jax.random.PRNGKey(0))
    for t in range(3):
        s, ts = step(jax.random.PRNGKey(t), s, jnp.array([0, 1], jnp.int32))
    np.testing.assert_array_equal(ts.terminated, [True, True])
    np.testing.assert_array_equal(ts.truncated, [False, False])

    params = JaxMARLParams(max_steps_in_episode=4)  # the adapter's own limit: truncation
    s, ts = RESET(jax.random.PRNGKey(0), params)
    for t in range(1, 5):
        s, ts = STEP(jax.random.PRNGKey(t), s, jnp.array([2, 1], jnp.int32), params)
        if t < 4:
            assert not ts.truncated.any()
    np.testing.assert_array_equal(ts.terminated, [True, False])
    np.testing.assert_array_equal(ts.truncated, [False, True])
    assert not ts.acting.any()


def test_vmapped_matches_single_env_steps():
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    actions = jax.random.randint(jax.random.PRNGKey(1), (4, 3, 2), 0, 3)
    step_v = jax.jit(jax.vmap(ENV.step, in_axes=(0, 0, 0, None)))
    s, _ = jax.jit(jax.vmap(ENV.reset, in_axes=(0, None)))(keys, ENV.params)
    for t in range(4):
        s_next, ts = step_v(keys, s, actions[t], ENV.params)
        for e in range(3):
            _, ts_e = STEP(keys[e], env_slice(s, e), actions[t, e])
            for a, b in zip(jax.tree.leaves(ts_e), jax.tree.leaves(env_slice(ts, e)), strict=True):
                np.testing.assert_array_equal(a, b)
        s = s_next


def test_check_env_and_donating_rollout():
    report = js.check_env(ENV, num_envs=4, num_steps=30)
    assert report.ok, str(report)
    # Eager init + donating jitted rollout: the adapter's reset must share no array between
    # its state and its TimeStep (an eager vmap would hand it out as one buffer, donated twice).
    pol = js.RandomPolicy(ENV.observation_space, ENV.action_space)
    rollout = js.jit_rollout(js.make_rollout(ENV, pol, 2, 12))
    state, traj = rollout((), js.init_rollout_state(ENV, pol, 2, jax.random.PRNGKey(0)))
    done = np.asarray(traj.terminated | traj.truncated).all(-1)
    np.testing.assert_array_equal(np.asarray(traj.is_reset)[1:], done[:-1])
    assert done.any()
    rollout((), state, traj)  # buffers passed back


@struct.dataclass
class MixedState:
    count: jax.Array  # float32[3], in JaxMARL's agent order
    step: jax.Array  # int32[]


@dataclasses.dataclass(frozen=True)
class FakeMixed:
    """Two tanks and a scout, the scout between the tanks in ``agents`` (not contiguous).

    Each agent adds its action to its own counter. A tank sees ``[own, total, step]`` and acts
    in ``Discrete(3)``; the scout sees ``[[own, step]]`` (shape ``(1, 2)``) and acts in
    ``Discrete(2)`` (``scout_act`` swaps in another action space). Reward: the action times
    the agent's position in ``agents`` plus one. The episode ends after ``max_steps`` steps.
    """

    max_steps: int = 3
    scout_obs: object = None
    scout_act: object = None
    agents: tuple = ("tank_0", "scout_0", "tank_1")
    num_agents: int = 3

    def observation_space(self, agent):
        if agent == "scout_0":
            return self.scout_obs or Box(-np.inf, np.inf, (1, 2))
        return Box(-np.inf, np.inf, (3,))

    def action_space(self, agent):
        return (self.scout_act or Discrete(2)) if agent == "scout_0" else Discrete(3)

    def _obs(self, s):
        c, t = s.count, s.step.astype(jnp.float32)
        return {
            "tank_0": jnp.stack([c[0], c.sum(), t]),
            "scout_0": jnp.stack([c[1], t])[None],
            "tank_1": jnp.stack([c[2], c.sum(), t]),
        }

    def reset(self, key):
        s = MixedState(jnp.zeros(3, jnp.float32), jnp.zeros((), jnp.int32))
        return self._obs(s), s

    def step_env(self, key, state, actions):
        a = jnp.stack([actions[n] for n in self.agents]).astype(jnp.float32)
        s = state.replace(count=state.count + a, step=state.step + 1)
        rewards = {n: a[i] * (i + 1) for i, n in enumerate(self.agents)}
        over = s.step >= self.max_steps
        return self._obs(s), s, rewards, {n: over for n in (*self.agents, "__all__")}, {}


MIXED = from_jaxmarl(FakeMixed(), env_id="mixed")


@dataclasses.dataclass(frozen=True)
class FakeUnnamed(FakeMixed):
    """FakeMixed with agent names that do not tell the groups apart (``a_1`` is the scout)."""

    agents: tuple = ("a_0", "a_1", "a_2")

    def observation_space(self, agent):
        return super().observation_space("scout_0" if agent == "a_1" else agent)

    def action_space(self, agent):
        return super().action_space("scout_0" if agent == "a_1" else agent)


def test_differing_spaces_become_groups_in_group_order():
    layout = MIXED.agent_layout
    assert [(g.name, g.agent_ids) for g in layout.groups] == [
        ("tank", ("tank_0", "tank_1")),
        ("scout", ("scout_0",)),
    ]
    assert MIXED.agent_ids == ("tank_0", "tank_1", "scout_0") == layout.agent_ids
    raw = FakeMixed()
    for a in raw.agents:  # each agent's own spaces, as JaxMARL declares them
        assert MIXED.observation_spaces[a] == convert_jaxmarl_space(raw.observation_space(a))
        assert MIXED.action_spaces[a] == convert_jaxmarl_space(raw.action_space(a))
    assert MIXED.observation_space == js.spaces.Box(-np.inf, np.inf, (3,))  # the carrier
    assert MIXED.action_space == js.spaces.Discrete(3)
    assert ENV.agent_layout is None  # shared spaces: no groups, as before
    # Agent names that do not tell the groups apart give numbered groups.
    unnamed = from_jaxmarl(FakeUnnamed()).agent_layout
    assert [(g.name, g.agent_ids) for g in unnamed.groups] == [
        ("group_0", ("a_0", "a_2")),
        ("group_1", ("a_1",)),
    ]


def test_grouped_steps_match_the_wrapped_env_agent_by_agent():
    raw = FakeMixed(max_steps=3)
    env = from_jaxmarl(raw)
    layout = env.agent_layout
    reset, step = jax.jit(env.reset), jax.jit(env.step)
    s, ts = reset(jax.random.PRNGKey(0))
    raw_obs, raw_s = raw.reset(jax.random.PRNGKey(0))

    def check(ts, raw_obs, raw_rew=None, raw_done=None):
        for i, a in enumerate(env.agent_ids):
            own = layout.unpack_agent_obs(a, ts.obs[i])
            np.testing.assert_array_equal(own, raw_obs[a])
            if raw_rew is not None:
                assert float(ts.reward[i]) == float(raw_rew[a])
                assert bool(ts.terminated[i]) == bool(raw_done[a])
        np.testing.assert_array_equal(ts.obs[2, 2:], 0.0)  # the scout's padding

    check(ts, raw_obs)
    assert ts.obs.shape == (3, 3)
    # Carrier actions in axis order (tank_0, tank_1, scout_0) reach the right agents.
    plan = [[2, 0, 1], [1, 2, 0], [0, 1, 1]]
    for t, row in enumerate(plan):
        s, ts = step(jax.random.PRNGKey(t), s, jnp.array(row, jnp.int32))
        by_name = dict(zip(env.agent_ids, row, strict=True))
        raw_obs, raw_s, raw_rew, raw_done, _ = raw.step_env(
            jax.random.PRNGKey(t), raw_s, {a: jnp.int32(by_name[a]) for a in raw.agents}
        )
        check(ts, raw_obs, raw_rew, raw_done)
    np.testing.assert_array_equal(s.env_state.count, [3, 2, 3])  # tank_0, scout_0, tank_1
    assert ts.terminated.all() and not ts.acting.any()


def test_grouped_rollout_runs_with_a_random_policy():
    pol = js.RandomPolicy(MIXED.observation_space, MIXED.action_space)
    rollout = js.jit_rollout(js.make_rollout(MIXED, pol, 2, 5))
    _, traj = rollout((), js.init_rollout_state(MIXED, pol, 2, jax.random.PRNGKey(0)))
    assert traj.obs.shape == (6, 2, 3, 3)
    np.testing.assert_array_equal(np.asarray(traj.obs)[:, :, 2, 2:], 0.0)  # scout's padding
    # The scout's own observation is [[own count, step]]: its counter rises by its actions.
    scout = np.asarray(MIXED.agent_layout.unpack_agent_obs("scout_0", traj.obs[:, :, 2]))
    assert scout.shape == (6, 2, 1, 2)
    acts = np.asarray(traj.actions)[:, :, 2]
    reset = np.asarray(traj.is_reset)
    for e in range(2):
        for t in range(5):
            if not reset[t, e]:
                assert scout[t + 1, e, 0, 0] == scout[t, e, 0, 0] + acts[t, e]


def test_spaces_groups_cannot_carry_are_refused_naming_agents():
    with pytest.raises(TypeError, match=r"all Discrete or all Box.*'scout_0': observation"):
        from_jaxmarl(FakeMixed(scout_act=Box(-1.0, 1.0, (2,))))
    with pytest.raises(TypeError, match=r"not a Box.*'tank_0': observation Box"):
        from_jaxmarl(FakeMixed(scout_obs=Discrete(4)))
    with pytest.raises(TypeError, match="MultiAgentEnv"):
        from_jaxmarl(object())
    with pytest.raises(TypeError, match="unsupported space"):
        convert_jaxmarl_space(object())
    # Hanabi's Box declares a bare int shape.
    assert convert_jaxmarl_space(Box(0, 1, np.int64(5))) == js.spaces.Box(0, 1, (5,))


@pytest.mark.slow  # imports jaxmarl (seconds); skipped where jaxmarl is not installed
def test_real_jaxmarl_mpe_matches_stepping_by_hand():
    jaxmarl = pytest.importorskip("jaxmarl")
    raw = jaxmarl.make("MPE_simple_spread_v3")
    env = from_jaxmarl(raw)
    assert env.agent_ids == tuple(raw.agents) and env.action_space == js.spaces.Discrete(5)
    assert env.observation_space == js.spaces.Box(-np.inf, np.inf, (18,))

    def stack(d):
        return jnp.stack([d[n] for n in raw.agents])

    @jax.jit
    def both(key, actions):  # the adapter and JaxMARL's own step_env side by side, one compile
        s, ts = env.reset(key)
        obs, raw_state = raw.reset(key)

        def body(carry, x):
            s, raw_state = carry
            k, a = x
            s, ts = env.step(k, s, a)
            obs, raw_state, rew, done, _ = raw.step_env(
                k, raw_state, {n: a[i] for i, n in enumerate(raw.agents)}
            )
            return (s, raw_state), (ts, stack(obs), stack(rew), stack(done))

        keys = jax.random.split(key, actions.shape[0])
        _, out = jax.lax.scan(body, (s, raw_state), (keys, actions))
        return ts.obs, stack(obs), out

    actions = jax.random.randint(jax.random.PRNGKey(1), (4, env.num_agents), 0, 5)
    obs0, raw_obs0, (ts, raw_obs, raw_rew, raw_done) = both(jax.random.PRNGKey(0), actions)
    np.testing.assert_allclose(obs0, raw_obs0, rtol=1e-6)
    np.testing.assert_allclose(ts.obs, raw_obs, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ts.reward, raw_rew, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(ts.terminated, raw_done)
    assert ts.acting.all() and not ts.truncated.any()


def _side_by_side(env, raw, key, actions):
    """The adapter and JaxMARL's own ``step_env`` stepped with the same keys and carrier
    actions (``[T, A]``, agent-axis order), in one jitted program: the adapter's
    TimeSteps, and JaxMARL's observations, rewards and dones per agent name."""

    def to_dict(a):
        return {n: a[i] for i, n in enumerate(env.agent_ids)}

    @jax.jit
    def both(key, actions):
        s, ts0 = env.reset(key)
        obs0, raw_state = raw.reset(key)

        def body(carry, x):
            s, raw_state = carry
            k, a = x
            s, ts = env.step(k, s, a)
            obs, raw_state, rew, done, _ = raw.step_env(k, raw_state, to_dict(a))
            return (s, raw_state), (ts, obs, rew, done)

        keys = jax.random.split(key, actions.shape[0])
        _, out = jax.lax.scan(body, (s, raw_state), (keys, actions))
        return ts0, obs0, out

    return both(key, actions)


@pytest.mark.slow  # imports jaxmarl and compiles two MPE programs
@pytest.mark.parametrize(
    ("env_id", "groups"),
    [
        ("MPE_simple_tag_v3", {"adversary": (3, 16), "agent": (1, 14)}),
        ("MPE_simple_adversary_v3", {"adversary": (1, 8), "agent": (2, 10)}),
    ],
)
def test_real_jaxmarl_groups_match_stepping_by_hand(env_id, groups):
    jaxmarl = pytest.importorskip("jaxmarl")
    raw = jaxmarl.make(env_id)
    env = js.make(f"jaxmarl:{env_id}")
    layout = env.agent_layout
    assert {g.name: (len(g.agent_ids), g.observation_space.shape[0]) for g in layout.groups} == (
        groups
    )
    assert sorted(env.agent_ids) == sorted(raw.agents)
    for a in raw.agents:  # each agent's own spaces are JaxMARL's, converted
        assert env.observation_spaces[a] == convert_jaxmarl_space(raw.observation_space(a))
        assert env.action_spaces[a] == convert_jaxmarl_space(raw.action_space(a))
    width = max(d for _, d in groups.values())
    assert env.observation_space.shape == (width,) and env.action_space == js.spaces.Discrete(5)

    actions = jax.random.randint(jax.random.PRNGKey(1), (4, env.num_agents), 0, 5)
    ts0, obs0, (ts, raw_obs, raw_rew, raw_done) = _side_by_side(
        env, raw, jax.random.PRNGKey(0), actions
    )
    for i, a in enumerate(env.agent_ids):
        size = env.observation_spaces[a].shape[0]
        np.testing.assert_array_equal(layout.unpack_agent_obs(a, ts0.obs[i]), obs0[a])
        np.testing.assert_array_equal(layout.unpack_agent_obs(a, ts.obs[:, i]), raw_obs[a])
        np.testing.assert_array_equal(ts.obs[:, i, size:], 0.0)  # the padding
        np.testing.assert_array_equal(ts0.obs[i, size:], 0.0)
        np.testing.assert_array_equal(ts.reward[:, i], raw_rew[a])
        np.testing.assert_array_equal(ts.terminated[:, i], raw_done[a])
    assert ts.acting.all() and not ts.truncated.any()

    # A rollout with a random policy over the carrier spaces (every group acts in Discrete(5)).
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    rollout = js.jit_rollout(js.make_rollout(env, pol, 2, 3))
    _, traj = rollout((), js.init_rollout_state(env, pol, 2, jax.random.PRNGKey(2)))
    assert traj.obs.shape == (4, 2, env.num_agents, width)
    for i, a in enumerate(env.agent_ids):
        np.testing.assert_array_equal(
            np.asarray(traj.obs)[:, :, i, env.observation_spaces[a].shape[0] :], 0.0
        )
    assert np.isfinite(np.asarray(traj.obs)).all()
