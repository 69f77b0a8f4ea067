"""Env axis split over 2 CPU devices (run in a subprocess: the device count is fixed at start)."""

import textwrap

from tests.devices import run_on_devices

SCRIPT = textwrap.dedent(
    """
    import jax, numpy as np
    import jaxsampler as js
    from jaxsampler.rollout import placement
    from tests.fakes import FakeEnv, check_fake_trajectory
    assert jax.device_count() == 2, jax.devices()
    env = FakeEnv(); pol = js.RandomPolicy(env.observation_space, env.action_space)
    mesh = placement.env_mesh(2)
    E, T = 6, 10
    rollout = js.jit_rollout(js.make_rollout(env, pol, E, T, mesh=mesh))
    def run(seed):
        s = js.init_rollout_state(env, pol, E, jax.random.PRNGKey(seed), mesh=mesh)
        s, t1 = rollout((), s)
        t1 = jax.device_get(t1)
        s, t2 = rollout((), s)
        return jax.device_get(s), t1, jax.device_get(t2)
    s, t1, t2 = run(0)
    assert t1.obs.shape == (T + 1, E, 1, 2) and t1.is_reset.shape == (T, E)
    seen = check_fake_trajectory(t1); seen2 = check_fake_trajectory(t2)
    assert seen["resets"] + seen2["resets"] > 0
    # Deterministic for a given device count.
    s_b, t1_b, t2_b = run(0)
    for a, b in zip(jax.tree.leaves((t1, t2)), jax.tree.leaves((t1_b, t2_b))):
        np.testing.assert_array_equal(a, b)
    # The two shards draw different random streams (no key reuse across devices).
    assert not np.array_equal(t1.actions[:, :3], t1.actions[:, 3:])
    # ...and each env the stream it has on one device.
    r1 = js.jit_rollout(js.make_rollout(env, pol, E, T))
    s1 = r1.init(jax.random.PRNGKey(0))
    s1, u1 = r1((), s1)
    for a, b in zip(jax.tree.leaves(t1), jax.tree.leaves(jax.device_get(u1))):
        np.testing.assert_array_equal(a, b)
    # Indivisible widths are refused with a clear message.
    try:
        js.make_rollout(env, pol, 5, T, mesh=mesh)
    except ValueError as e:
        assert "cannot be split evenly" in str(e) and "nearest valid: 4 or 6" in str(e), e
    else:
        raise AssertionError("expected ValueError")
    print("SHARDED-OK")
    """
)


def test_sharded_rollout_on_two_cpu_devices():
    run_on_devices(SCRIPT, "SHARDED-OK", timeout=300)
