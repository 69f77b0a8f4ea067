"""PredatorPrey-v0: two agent groups of their own spaces, against a NumPy re-implementation."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.envs.predator_prey import PredatorPrey, PredatorPreyParams
from jaxsampler.spaces import Box, Discrete

D = np.sqrt(0.5)
# Written out again here (not imported) so a wrong table in the env shows up.
PREDATOR = np.array([[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1]], np.float32)
PREY = np.array(
    [[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1], [-D, -D], [D, -D], [-D, D], [D, D]], np.float32
)


class RefPredatorPrey:
    """NumPy version of one env's rules (float32 positions, like the env)."""

    def __init__(self, pos, p: PredatorPreyParams):
        self.pos, self.p = np.array(pos, np.float32), p
        self.n = len(self.pos) - 1  # predators
        self.caught, self.t = False, 0

    def obs(self) -> tuple[np.ndarray, np.ndarray]:
        """``(predators [P, 4], prey [2 + 2P])``."""
        prey = self.pos[self.n]
        predators = np.stack([np.concatenate([q, prey - q]) for q in self.pos[: self.n]])
        return predators, np.concatenate([prey, (self.pos[: self.n] - prey).ravel()])

    def step(self, action) -> np.ndarray:
        """Carrier actions ``int[P + 1]`` (anything out of a group's range stays)."""
        p, n = self.p, self.n
        going = not self.caught and self.t < p.max_steps_in_episode
        new = self.pos.copy()
        for i, a in enumerate(action):
            table, speed = (PREDATOR, p.predator_speed) if i < n else (PREY, p.prey_speed)
            unit = table[a] if 0 <= a < len(table) else table[0]
            new[i] = np.clip(self.pos[i] + unit * np.float32(speed), -1, 1)
        if going:
            self.pos = new
        dist = np.sqrt(((self.pos[:n] - self.pos[n]) ** 2).sum(-1))
        now = going and bool((dist <= np.float32(p.capture_radius)).any())
        self.caught |= now
        self.t += 1
        reward = np.zeros(n + 1, np.float32)
        if going:
            reward[:n] = p.capture_reward if now else 0.0
            reward[n] = -p.capture_reward if now else p.survival_bonus
        return reward

    @property
    def terminated(self) -> bool:
        return self.caught

    @property
    def truncated(self) -> bool:
        return self.t >= self.p.max_steps_in_episode and not self.caught


def chase(pos: np.ndarray) -> np.ndarray:
    """Each predator's move along the axis where the prey (``pos[-1]``) is farther."""
    dx, dy = (pos[-1] - pos[:-1]).T
    return np.where(np.abs(dx) >= np.abs(dy), np.where(dx > 0, 2, 1), np.where(dy > 0, 4, 3))


@functools.cache
def batched(n_predators: int):
    env = PredatorPrey(n_predators=n_predators)
    reset = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))
    step = jax.jit(jax.vmap(env.step, in_axes=(0, 0, 0, None)))
    return env, reset, step


def unpack(env: PredatorPrey, obs) -> tuple[np.ndarray, np.ndarray]:
    """The carrier observations ``[E, A, D]`` as ``(predators [E, P, 4], prey [E, 2 + 2P])``,
    asserting the padding after each group's values is zero."""
    layout, obs = env.agent_layout, np.asarray(obs)
    p0, p1 = layout.slots("predator")
    q0, q1 = layout.slots("prey")
    assert (p0, p1, q0, q1) == (0, env.n_predators, env.n_predators, env.n_predators + 1)
    for name, a, b in (("predator", p0, p1), ("prey", q0, q1)):
        size = layout.group(name).observation_space.shape[0]
        np.testing.assert_array_equal(obs[:, a:b, size:], 0.0, err_msg=f"{name} padding")
    return layout.unpack_obs("predator", obs[:, p0:p1]), layout.unpack_obs("prey", obs[:, q0])


@pytest.mark.parametrize(("n_predators", "seed"), [(2, 0), (2, 1), (3, 2), (1, 3)])
def test_random_steps_match_numpy_on_every_agent(n_predators, seed):
    env, reset, step = batched(n_predators)
    num_envs, a = 12, n_predators + 1
    # A wide capture radius and a short limit: some episodes end by capture, some by the
    # limit, and the steps past the end check that nothing moves any more.
    params = PredatorPreyParams(capture_radius=0.3, max_steps_in_episode=20)
    s, ts = reset(jax.random.split(jax.random.PRNGKey(seed), num_envs), params)
    refs = [RefPredatorPrey(np.asarray(s.pos[e]), params) for e in range(num_envs)]
    spaces = {g.name: g.observation_space for g in env.agent_groups}
    rng = np.random.default_rng(seed)
    seen = set()
    for t in range(0, 24):
        if t:
            action = rng.integers(0, 9, (num_envs, a)).astype(np.int32)  # carrier actions
            if t % 3:  # predators chase on two steps of three, so that captures happen
                action[:, :n_predators] = [chase(r.pos) for r in refs]
            keys = jax.random.split(jax.random.PRNGKey(100 + t), num_envs)
            s, ts = step(keys, s, action, params)
            reward = np.stack([r.step(action[e]) for e, r in enumerate(refs)])
        else:
            reward = np.zeros((num_envs, a), np.float32)
        predators, prey = unpack(env, ts.obs)
        for e, ref in enumerate(refs):
            where = f"step {t} env {e}"
            want_pred, want_prey = ref.obs()
            np.testing.assert_allclose(predators[e], want_pred, atol=1e-6, err_msg=where)
            np.testing.assert_allclose(prey[e], want_prey, atol=1e-6, err_msg=where)
            for i in range(n_predators):
                assert bool(spaces["predator"].contains(predators[e, i])), where
            assert bool(spaces["prey"].contains(prey[e])), where
            np.testing.assert_allclose(ts.reward[e], reward[e], atol=1e-7, err_msg=where)
            np.testing.assert_array_equal(ts.terminated[e], np.full(a, ref.terminated), where)
            np.testing.assert_array_equal(ts.truncated[e], np.full(a, ref.truncated), where)
            done = ref.terminated or ref.truncated
            np.testing.assert_array_equal(ts.acting[e], np.full(a, not done), where)
            seen.add("caught" if ref.terminated else "limit" if ref.truncated else "going")
    assert seen == {"caught", "limit", "going"}


def test_spaces_per_agent_and_carrier():
    env = js.make("PredatorPrey-v0")
    assert env == PredatorPrey(n_predators=2) and env.name == "PredatorPrey-v0"
    assert env.num_agents == 3 and env.agents_end_together
    assert env.agent_ids == ("predator_0", "predator_1", "prey_0")
    pred_obs = Box(np.array([-1, -1, -2, -2]), np.array([1, 1, 2, 2]), (4,), np.float32)
    prey_obs = Box(np.array([-1, -1, -2, -2, -2, -2]), np.array([1, 1, 2, 2, 2, 2]), (6,))
    assert env.observation_spaces == {
        "predator_0": pred_obs,
        "predator_1": pred_obs,
        "prey_0": prey_obs,
    }
    assert env.action_spaces == {
        "predator_0": Discrete(5),
        "predator_1": Discrete(5),
        "prey_0": Discrete(9),
    }
    assert env.observation_space == prey_obs  # the widest group's values, predators padded
    assert env.action_space == Discrete(9)
    wide = js.make("PredatorPrey-v0", n_predators=3)
    assert wide.num_agents == 4 and wide.observation_space.shape == (8,)
    assert wide.observation_spaces["prey_0"].shape == (8,)
    assert wide.observation_spaces["predator_2"].shape == (4,)


def _staged(env: PredatorPrey, pos):
    s, _ = env.reset(jax.random.PRNGKey(0))
    return s.replace(pos=np.asarray(pos, np.float32))


def test_capture_ends_the_episode_for_everyone():
    env = PredatorPrey()
    p = env.default_params
    # Predator 1 is 0.25 left of the prey: its step right brings it 0.15 away (caught);
    # the prey's action 8 (up-right) is cut by the arena's corner.
    s = _staged(env, [[-0.9, -0.9], [0.65, 0.9], [0.9, 0.9]])
    s, ts = env.step(jax.random.PRNGKey(1), s, np.array([0, 2, 8], np.int32))
    np.testing.assert_allclose(s.pos, [[-0.9, -0.9], [0.75, 0.9], [1.0, 1.0]], atol=1e-6)
    assert not bool(ts.terminated.any())  # 0.269 > 0.15 after the prey's diagonal move
    s, ts = env.step(jax.random.PRNGKey(2), s, np.array([0, 2, 5], np.int32))  # prey: down-left
    assert bool(ts.terminated.all()) and not bool(ts.truncated.any())
    np.testing.assert_allclose(ts.reward, [p.capture_reward, p.capture_reward, -1.0])
    assert not bool(ts.acting.any())
    s2, ts2 = env.step(jax.random.PRNGKey(3), s, np.array([2, 1, 1], np.int32))
    np.testing.assert_array_equal(s2.pos, s.pos)  # nothing moves after the end
    np.testing.assert_array_equal(ts2.reward, 0.0)
    assert bool(ts2.terminated.all())


def test_out_of_range_predator_actions_stay():
    env = PredatorPrey()
    start = [[-0.5, 0.0], [-0.5, 0.5], [0.5, 0.0]]
    s = _staged(env, start)
    s, ts = env.step(jax.random.PRNGKey(1), s, np.array([5, 8, 4], np.int32))
    np.testing.assert_allclose(s.pos, [[-0.5, 0.0], [-0.5, 0.5], [0.5, 0.15]], atol=1e-7)
    np.testing.assert_allclose(ts.reward, [0.0, 0.0, 0.01], atol=1e-7)


def test_check_env_rollout_and_sampler_run_with_the_carrier_random_policy():
    env = js.make("PredatorPrey-v0")
    report = js.check_env(env, num_envs=4)
    assert report.ok, str(report)
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    state = js.init_rollout_state(env, pol, 3, jax.random.PRNGKey(1))
    _, traj = jax.jit(js.make_rollout(env, pol, 3, 60))(pol.init(jax.random.PRNGKey(0)), state)
    assert traj.obs.shape == (61, 3, 3, 6) and traj.actions.shape == (60, 3, 3)
    predators = np.asarray(traj.obs)[:, :, :2]
    np.testing.assert_array_equal(predators[..., 4:], 0.0)  # padding, every step
    assert np.asarray(traj.is_reset).any()  # episodes end (by the 50-step limit at the latest)
    sampler = js.Sampler(env, pol, num_envs=2, rollout_length=30, seed=0)
    episodes = sampler.sample(())
    assert episodes and all(set(ep.agent_ids) <= set(env.agent_ids) for ep in episodes)
    sampler.close()


def test_render_draws_every_agent():
    env = PredatorPrey()
    s = _staged(env, [[-0.5, 0.0], [0.0, 0.5], [0.5, -0.5]])
    frame = np.asarray(jax.jit(env.render)(s))
    assert frame.shape == (200, 200, 3) and frame.dtype == np.uint8
    # Pixel centers of the agents: x = (pos + 1.1) / 2.2 * 200, y = (1.1 - pos) / 2.2 * 200.
    for (x, y), color in (((-0.5, 0.0), (220, 40, 40)), ((0.5, -0.5), (40, 170, 60))):
        col, row = int((x + 1.1) / 2.2 * 200), int((1.1 - y) / 2.2 * 200)
        np.testing.assert_array_equal(frame[row, col], color)


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "3"])
def test_bad_predator_count(bad):
    with pytest.raises(ValueError, match="n_predators >= 1"):
        PredatorPrey(n_predators=bad)
