"""jaxsampler.rollout.distributed: a rollout on a mesh over 2 processes against the same
rollout on 2
local devices, and the failure behaviour (coordinator that never answers, a peer that dies,
bad arguments). Each multi-process case starts real processes on 127.0.0.1 (~10-20 s)."""

import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from jaxsampler.rollout import distributed
from tests.processes import ROOT, free_port, run_processes, spawn_processes

# The same rollout, E=8 CartPole envs, random policy, NormalizeObservation, T=12, key 0.
ROLLOUT = textwrap.dedent(
    """
    import jax, numpy as np
    import jaxsampler as js
    from jaxsampler.rollout import placement
    from jaxsampler.transforms.normalize import NormalizeObservation
    E, T = 8, 12
    def rollout(mesh):
        env = js.make("CartPole-v1")
        pol = js.RandomPolicy(env.observation_space, env.action_space)
        r = js.make_rollout(env, pol, E, T, transforms=(NormalizeObservation(),), mesh=mesh)
        s = r.init(jax.random.PRNGKey(0))
        s, t1 = r((), s)
        s, t2 = r((), s)
        stats = placement.to_host(s.transform_state.stages[0].shared)
        return placement.to_host(t1), placement.to_host(t2), stats
    """
)

MULTI = ROLLOUT + textwrap.dedent(
    """
    import os, sys
    from jaxsampler.rollout import distributed
    distributed.initialize()
    distributed.initialize()  # the same arguments again: nothing happens
    try:
        distributed.initialize("127.0.0.1:1", 3, 0)
    except RuntimeError as e:
        assert "already called" in str(e) and "num_processes=3" in str(e), e
    else:
        raise AssertionError("a second initialize with other arguments was accepted")
    assert jax.process_count() == 2 and jax.device_count() == 2
    mesh = placement.env_mesh()
    t1, t2, stats = rollout(mesh)
    sl = placement.local_env_slice(mesh, E)
    out = os.path.join(sys.argv[1], f"p{jax.process_index()}.npz")
    np.savez(out, start=sl.start, stop=sl.stop, **{
        f"{tag}{i}": leaf for tag, tree in (("t1_", t1), ("t2_", t2), ("stats_", stats))
        for i, leaf in enumerate(jax.tree.leaves(tree))})
    try:
        js.make_rollout(js.make("CartPole-v1"),
                        js.RandomPolicy(*(lambda e: (e.observation_space, e.action_space))(
                            js.make("CartPole-v1"))), 5, 4, mesh=mesh)
    except ValueError as e:
        print("INDIVISIBLE:", e)
    print("MULTI-OK")
    """
)


def test_two_process_rollout_is_the_two_device_rollout_sliced(tmp_path):
    script = MULTI.replace("sys.argv[1]", repr(str(tmp_path)))
    outs = run_processes(script, "MULTI-OK", n=2, devices=1, timeout=180)
    # The reference: one process, the same mesh size on 2 local devices (conftest gives 2).
    ns: dict = {}
    exec(ROLLOUT, ns)
    from jaxsampler.rollout import placement

    r1, r2, rstats = ns["rollout"](placement.env_mesh(2))
    ref = {
        f"{tag}{i}": np.asarray(leaf)
        for tag, tree in (("t1_", r1), ("t2_", r2), ("stats_", rstats))
        for i, leaf in enumerate(__import__("jax").tree.leaves(tree))
    }
    E = 8
    for p in range(2):
        got = np.load(tmp_path / f"p{p}.npz")
        assert (int(got["start"]), int(got["stop"])) == (4 * p, 4 * p + 4)
        sl = slice(4 * p, 4 * p + 4)
        for name, want in ref.items():
            have = got[name]
            if name.startswith("stats_"):
                # Global statistics: the same on both processes, equal to one process's.
                np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-6, err_msg=name)
                continue
            # Env-axis leaves: axis 1 of time-major buffers, axis 0 of slot-0 records.
            axis = next(a for a in range(want.ndim) if want.shape[a] == E)
            want = np.take(want, np.arange(E)[sl], axis=axis)
            assert have.shape == want.shape, (name, have.shape, want.shape)
            if np.issubdtype(want.dtype, np.floating):
                np.testing.assert_allclose(have, want, rtol=1e-4, atol=1e-5, err_msg=name)
            else:
                np.testing.assert_array_equal(have, want, err_msg=name)
    a0, a1 = (np.load(tmp_path / f"p{p}.npz") for p in range(2))
    for name in a0.files:
        if name.startswith("stats_"):
            np.testing.assert_array_equal(a0[name], a1[name])
    for out in outs:
        msg = re.search(r"INDIVISIBLE: (.*)", out)
        assert msg, out
        assert "num_envs=5" in msg[1] and "2 devices of 2 processes" in msg[1], msg[1]
        assert "nearest valid: 4 or 6" in msg[1], msg[1]


def test_coordinator_that_never_answers_times_out_with_the_address():
    port = free_port()  # nothing listens there
    script = textwrap.dedent(
        f"""
        from jaxsampler.rollout import distributed
        distributed.initialize("127.0.0.1:{port}", 2, 1, timeout_s=2)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode != 0
    assert "TimeoutError" in proc.stderr, proc.stderr[-3000:]
    assert f"127.0.0.1:{port}" in proc.stderr and "for 2 s" in proc.stderr, proc.stderr[-3000:]


PEER_DIES = textwrap.dedent(
    """
    import os
    from jaxsampler.rollout import distributed
    distributed.initialize()
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    mesh = Mesh(np.array(jax.devices()), ("env",))
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("env")), np.ones(2, "f4"))
    total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))
    for i in range(10**9):  # a collective in every iteration
        assert float(total(x)) == 4.0
        if i == 5 and jax.process_index() == 1:
            print("KILLING", flush=True)
            os.kill(os.getpid(), 9)
    """
)


def test_a_peer_killed_mid_collective_makes_the_survivor_fail_with_a_clear_error():
    procs = spawn_processes(PEER_DIES, n=2, devices=1)
    try:
        # A hang guard, not a speed assertion: the survivor exits within ~1 s of the kill.
        out0, err0 = procs[0].communicate(timeout=90)
        out1, _ = procs[1].communicate(timeout=30)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert procs[1].returncode == -9 and "KILLING" in out1
    assert procs[0].returncode == 1, err0[-3000:]
    assert "jaxsampler.rollout.distributed: process 0 of 2 stopped" in err0, err0[-3000:]
    assert "A peer process died or closed its connection" in err0, err0[-3000:]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(coordinator_address="127.0.0.1:1234", num_processes=2), "missing: process_id"),
        (dict(coordinator_address="nohost", num_processes=2, process_id=0), "host:port"),
        (dict(coordinator_address="h:1", num_processes=2, process_id=2), r"not in 0\.\.1"),
        (dict(coordinator_address="h:1", num_processes=0, process_id=0), ">= 1"),
        (dict(coordinator_address="h:1", num_processes=2, process_id=0, timeout_s=0), "> 0"),
        (dict(coordinator_address="h:1", num_processes=2, process_id=True), "must be an int"),
    ],
)
def test_bad_arguments_are_named(kwargs, match, monkeypatch):
    for var in (distributed.ENV_COORDINATOR, distributed.ENV_NUM_PROCESSES):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv(distributed.ENV_PROCESS_ID, raising=False)
    with pytest.raises(ValueError, match=match):
        distributed.initialize(**kwargs)


def test_bad_variables_are_named(monkeypatch):
    monkeypatch.setenv(distributed.ENV_COORDINATOR, "127.0.0.1:1234")
    monkeypatch.setenv(distributed.ENV_NUM_PROCESSES, "two")
    monkeypatch.setenv(distributed.ENV_PROCESS_ID, "0")
    with pytest.raises(ValueError, match="JAXSAMPLER_NUM_PROCESSES='two' is not an int"):
        distributed.initialize()


def test_initialize_after_jax_started_is_refused(monkeypatch):
    import jax

    jax.devices()  # the backend now runs in this (pytest) process
    with pytest.raises(RuntimeError, match="before anything touches JAX devices"):
        distributed.initialize("127.0.0.1:1234", 2, 0)
