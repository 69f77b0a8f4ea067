"""Sub-envs that fail or hang mid-episode do not take the sampler down.

Envs fail on purpose (an exception at the n-th ``step`` / ``reset`` of one env object,
a NaN observation, a ``step`` that blocks until the test releases it). Each check runs
the same ``HostSampler`` twice, once with a failure and once without, and asserts:

* the healthy sub-envs' episodes are identical to the run without failures;
* the failed sub-env's episode ends truncated at its last good observation, reward 0,
  ``info["env_error"]`` naming the error; with ``"restart"`` a new episode follows on a
  rebuilt env object, reset with :func:`restart_seed`; with ``"drop"`` nothing follows;
* ``"raise"`` gives a :class:`HostEnvError` with the env index, the method and the
  original error chained.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time

import jax.numpy as jnp
import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")

import jaxsampler as js  # noqa: E402
from jaxsampler.host_envs import (  # noqa: E402
    GymnasiumHostEnv,
    GymnasiumVectorHostEnv,
    HostEnvError,
    MultiAgentDictEnv,
)
from jaxsampler.host_envs.failures import FailureHandling, restart_seed  # noqa: E402
from jaxsampler.policies.base import Policy  # noqa: E402
from jaxsampler.sampling import HostSampler  # noqa: E402

L = 4  # episode length of Flaky


class Flaky(gym.Env):
    """obs = [idx, 1000 tag + 100 k + t] (``idx``: the sub-env, ``tag``: which env object
    of that sub-env, ``k``: its resets, ``t``: the step), reward = t, episodes of ``L``
    steps (terminated). ``fail=(method, n, kind)`` makes the n-th call of ``method``
    ("step" / "reset") of this object raise, return NaN, or block until ``release``."""

    def __init__(self, idx=0, tag=0, fail=None, release=None, close_error=False):
        self.observation_space = gym.spaces.Box(-1e5, 1e5, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.idx, self.tag, self.fail, self.release = idx, tag, fail, release
        self.close_error, self.closed = close_error, False
        self.k = self.t = 0
        self.calls = {"step": 0, "reset": 0}

    def _obs(self):
        return np.array([self.idx, 1000 * self.tag + 100 * self.k + self.t], np.float32)

    def _maybe_fail(self, method):
        self.calls[method] += 1
        if self.fail is None or self.fail[:2] != (method, self.calls[method]):
            return False
        kind = self.fail[2]
        if kind == "raise":
            raise RuntimeError(f"{method} {self.calls[method]} of env {self.idx} broke")
        if kind == "hang":  # until released (in a worker process: until terminated)
            self.release.wait() if self.release is not None else time.sleep(3600)
        return kind == "nan"

    def reset(self, *, seed=None, options=None):
        nan = self._maybe_fail("reset")
        self.k, self.t = self.k + 1, 0
        obs = self._obs() * (np.nan if nan else 1)
        return obs, {"seed": seed, "tag": self.tag}

    def step(self, action):
        nan = self._maybe_fail("step")
        self.t += 1
        obs = self._obs() * (np.nan if nan else 1)
        return obs, float(self.t), self.t >= L, False, {"t": self.t}

    def close(self):
        self.closed = True
        if self.close_error:
            raise OSError(f"env {self.idx} cannot close")


def factories(n, failing=None, fail=None, release=None, made=None):
    """``n`` factories; sub-env ``failing``'s first env object fails as ``fail`` says
    (rebuilt objects are healthy). ``made`` collects every env object."""
    counts = [0] * n

    def make(i):
        tag, counts[i] = counts[i], counts[i] + 1
        env = Flaky(i, tag, fail if (i == failing and tag == 0) else None, release)
        if made is not None:
            made.append(env)
        return env

    return [functools.partial(make, i) for i in range(n)]


@dataclasses.dataclass(frozen=True)
class Zeros(Policy):
    """action 0; extras["seen"] = the observation's counter (a known, deterministic policy)."""

    observation_space: object
    action_space: object

    def init(self, key):
        return ()

    def __call__(self, params, obs, key, state):
        return jnp.zeros(obs.shape[:2], jnp.int32), {"seen": obs[..., 1]}, state


def sampler(henv, length=14):
    policy = Zeros(henv.observation_space, henv.action_space)
    return HostSampler(henv, policy, rollout_length=length)


def by_env(episodes):
    """``{sub-env: [(obs, actions, rewards, seen, terminated, truncated, infos)]}``."""
    out: dict = {}
    for ep in episodes:
        obs = np.asarray(ep.get_observations())
        out.setdefault(int(obs[0, 0]), []).append(
            (
                obs[:, 1].tolist(),
                np.asarray(ep.get_actions()).tolist(),
                np.asarray(ep.get_rewards()).tolist(),
                np.asarray(ep.get_extra_model_outputs("seen")).tolist(),
                bool(ep.is_terminated),
                bool(ep.is_truncated),
                ep.get_infos(),
            )
        )
    return out


def run(n=3, length=14, calls=1, **env_options):
    """The episodes of ``calls`` sample() calls, by sub-env, and the host env."""
    fns = env_options.pop("fns", None) or factories(n)
    henv = GymnasiumHostEnv(fns, seed=0, **env_options)
    s = sampler(henv, length)
    eps = [ep for _ in range(calls) for ep in s.sample(())]
    return by_env(eps), henv


ERROR = "RuntimeError: step 6 of env 1 broke"
# Sub-env 1 fails at the 6th step of its first object: episode 2 (k=2) has 1 good step.
FAIL_STEP_6 = {"failing": 1, "fail": ("step", 6, "raise")}


def test_restart_truncates_the_failed_episode_and_starts_a_new_one_on_a_new_env():
    want, _ = run()
    got, henv = run(fns=factories(3, **FAIL_STEP_6), on_env_error="restart")
    assert got[0] == want[0] and got[2] == want[2]  # healthy sub-envs: untouched
    eps = got[1]
    assert eps[0] == want[1][0]  # the episode before the failure
    obs, acts, rewards, seen, term, trunc, infos = eps[1]
    # One good step (200 -> 201); the failed step repeats 201, reward 0, truncated.
    assert (obs, acts, rewards, seen) == ([200, 201, 201], [0, 0], [1.0, 0.0], [200, 201])
    assert (term, trunc) == (False, True)
    assert infos[-1] == {"env_error": ERROR}
    # A new episode on a new env object (tag 1), reset with the restart seed.
    obs, *_, infos = eps[2]
    assert obs[:2] == [1100, 1101]
    assert infos[0] == {"seed": restart_seed(0, 1, 1), "tag": 1}
    assert restart_seed(0, 1, 1) not in (0, 1, 2, None)
    stats = henv.failure_stats
    assert (stats.failures, stats.restarts, stats.timeouts, stats.dropped) == (1, 1, 0, [])
    assert stats.by_env == {1: 1} and stats.last_error == f"env 1 step: {ERROR}"
    assert henv.envs[1].tag == 1


def test_the_failure_poll_follows_the_host_env_protocol():
    """At the poll level: the failed sub-env's data is one truncated step; it then needs no
    action, and its next poll is the rebuilt env's first observation."""
    a = js.constants.DEFAULT_AGENT_ID
    henv = GymnasiumHostEnv(
        factories(2, failing=1, fail=("step", 2, "raise")), on_env_error="restart"
    )
    henv.poll()
    henv.send_actions({0: {a: 0}, 1: {a: 0}})
    henv.poll()
    henv.send_actions({0: {a: 1}, 1: {a: 1}})
    r = henv.poll()
    assert r.obs[0][a].tolist() == [0, 102] and r.rewards[0] == {a: 2.0}  # sub-env 0 stepped
    assert r.obs[1][a].tolist() == [1, 101]  # the last good observation, again
    assert (r.rewards[1], r.terminateds[1], r.truncateds[1]) == (
        {a: 0.0},
        {a: False, "__all__": False},
        {a: True, "__all__": True},
    )
    assert r.infos[1] == {a: {"env_error": "RuntimeError: step 2 of env 1 broke"}}
    with pytest.raises(KeyError, match="not waiting"):
        henv.send_actions({1: {a: 0}})
    henv.send_actions({0: {a: 0}})
    r = henv.poll()
    assert r.obs[1][a].tolist() == [1, 1100] and 1 not in r.rewards  # a new episode
    assert r.obs[0][a].tolist() == [0, 103]
    henv.close()


def test_the_failure_is_recorded_alike_when_its_episode_is_cut_across_calls():
    """The failure step is an ordinary poll: three 5-poll calls give the episodes of one
    15-poll call, cut into chunks that join up again."""

    def chunks(length, calls):
        henv = GymnasiumHostEnv(factories(2, **FAIL_STEP_6), seed=0, on_env_error="restart")
        s = sampler(henv, length)
        return [ep for _ in range(calls) for ep in s.sample(())]

    whole = by_env(chunks(15, 1))
    cut: dict = {}  # episode id -> (sub-env, its by_env row, chunks joined so far)
    for ep in chunks(5, 3):
        ((env, [row]),) = by_env([ep]).items()
        if ep.id_ in cut:  # a continuation: it starts at the last chunk's observation
            _, before, n = cut[ep.id_]
            obs, acts, rewards, seen, term, trunc, infos = row
            assert (obs[0], infos[0]) == (before[0][-1], before[6][-1])
            row = (
                before[0] + obs[1:],
                before[1] + acts,
                before[2] + rewards,
                before[3] + seen,
                term,
                trunc,
                before[6] + infos[1:],
            )
            cut[ep.id_] = (env, row, n + 1)
        else:
            cut[ep.id_] = (env, row, 1)
    rows: dict = {}
    for env, row, _ in cut.values():
        rows.setdefault(env, []).append(row)
    assert rows == whole
    assert any(ep[6][-1] == {"env_error": ERROR} for ep in whole[1])
    assert max(n for _, _, n in cut.values()) > 1  # some episodes were cut


def test_restart_closes_the_failed_env_and_ignores_its_close_error():
    made: list = []
    fns = factories(2, **FAIL_STEP_6, made=made)
    henv = GymnasiumHostEnv(fns, on_env_error="restart")
    first = henv.envs[1]
    first.close_error = True
    s = sampler(henv, 12)
    s.sample(())
    assert first.closed and henv.envs[1] is not first and not henv.envs[1].closed
    henv.close()
    assert all(e.closed for e in made)


def test_drop_ends_the_episode_and_never_steps_the_env_again():
    want, _ = run(length=20)
    got, henv = run(length=20, fns=factories(3, **FAIL_STEP_6), on_env_error="drop")
    assert got[0] == want[0] and got[2] == want[2]  # the sampler did not wait for env 1
    assert len(got[1]) == 2 and got[1][0] == want[1][0]
    assert got[1][1][:6] == ([200, 201, 201], [0, 0], [1.0, 0.0], [200, 201], False, True)
    assert henv.failure_stats.dropped == [1] and henv.envs[1] is None
    assert henv.num_envs == 3 and not henv.closed


def test_drop_of_every_env_closes_the_env_and_then_raises():
    fns = [functools.partial(Flaky, 0, 0, ("step", 2, "raise"))]
    henv = GymnasiumHostEnv(fns, on_env_error="drop")
    s = sampler(henv, 10)
    eps = by_env(s.sample(()))[0]  # the call ends when the env closes: no deadlock
    assert eps[-1][5] and eps[-1][6][-1] == {"env_error": "RuntimeError: step 2 of env 0 broke"}
    assert henv.closed and s.metrics.num_env_steps_sampled == 2
    with pytest.raises(HostEnvError, match="every sub-env was dropped") as info:
        s.sample(())
    assert info.value.method == "poll"


def test_raise_names_the_env_and_the_method_and_chains_the_error():
    henv = GymnasiumHostEnv(factories(3, **FAIL_STEP_6))  # the default is "raise"
    assert henv.failure_handling.on_env_error == "raise"
    with pytest.raises(HostEnvError, match=r"sub-env 1 failed in step\(\): " + ERROR) as info:
        sampler(henv).sample(())
    assert isinstance(info.value, RuntimeError)
    assert (info.value.env_index, info.value.method) == (1, "step")
    assert isinstance(info.value.__cause__, RuntimeError)
    assert str(info.value.__cause__) == "step 6 of env 1 broke"


def test_a_failing_first_reset_is_retried_on_a_rebuilt_env_in_the_same_poll():
    fns = factories(2, failing=0, fail=("reset", 1, "raise"))
    henv = GymnasiumHostEnv(fns, on_env_error="restart")
    first = henv.poll()
    assert first.obs[0]["default_agent"].tolist() == [0, 1100]  # the rebuilt object's reset
    assert first.infos[0]["default_agent"]["seed"] == restart_seed(0, 0, 1)
    assert first.obs[1]["default_agent"].tolist() == [1, 100]
    assert henv.failure_stats.by_env == {0: 1}
    with pytest.raises(HostEnvError, match=r"sub-env 0 failed in reset\(\)"):
        GymnasiumHostEnv(factories(1, failing=0, fail=("reset", 1, "raise"))).poll()
    henv = GymnasiumHostEnv(
        factories(2, failing=1, fail=("reset", 1, "raise")), on_env_error="drop"
    )
    assert set(henv.poll().obs) == {0} and henv.failure_stats.dropped == [1]


class Broken(Flaky):
    def reset(self, *, seed=None, options=None):
        raise ValueError("no simulator licence")


def test_a_permanently_broken_env_raises_after_max_env_restarts():
    henv = GymnasiumHostEnv([Broken, Flaky], on_env_error="restart", max_env_restarts=2)
    with pytest.raises(HostEnvError, match="failed 3 times in a row") as info:
        henv.poll()
    assert info.value.method == "restart" and "no simulator licence" in str(info.value)
    assert henv.failure_stats.restarts == 2 and henv.failure_stats.failures == 3


def test_failures_in_a_row_are_counted_only_until_a_good_step():
    """Every env object fails at its 2nd step: each failure follows a good step, so
    restarts go on beyond max_env_restarts."""
    fns = [lambda: Flaky(0, 0, ("step", 2, "raise"))]
    henv = GymnasiumHostEnv(fns, on_env_error="restart", max_env_restarts=1)
    s = sampler(henv, 12)
    eps = by_env(s.sample(()))[0]
    assert henv.failure_stats.failures == len(eps) >= 3  # more than max_env_restarts
    for ep in eps:
        assert ep[0] == [100, 101, 101] and ep[5] and "env_error" in ep[6][-1]


def test_bad_options_and_restart_without_factories_are_refused():
    made: list = []
    with pytest.raises(ValueError, match="envs \\[1\\] were given as env objects"):
        GymnasiumHostEnv([factories(1, made=made)[0], Flaky()], on_env_error="restart")
    assert made[0].closed  # the env it made is closed again
    GymnasiumHostEnv([Flaky, Flaky()], on_env_error="drop").close()  # objects can be dropped
    with pytest.raises(ValueError, match="on_env_error must be 'raise', 'restart' or 'drop'"):
        GymnasiumHostEnv([Flaky], on_env_error="retry")
    with pytest.raises(ValueError, match="max_env_restarts must be an int >= 0"):
        GymnasiumHostEnv([Flaky], max_env_restarts=-1)
    with pytest.raises(ValueError, match="step_timeout_s must be a finite number > 0"):
        GymnasiumHostEnv([Flaky], step_timeout_s=0)
    with pytest.raises(ValueError, match="pass a function that makes it"):
        GymnasiumVectorHostEnv(gym.vector.SyncVectorEnv([Flaky]), on_env_error="restart")


def test_make_passes_the_failure_options():
    henv = js.make("gym:CartPole-v1", num_envs=2, on_env_error="drop", step_timeout_s=1.5)
    assert henv.failure_handling == FailureHandling("drop", 3, 1.5, 8, False)
    henv = js.make("gym:CartPole-v1", on_env_error="restart", max_episode_steps=7)
    assert henv.failure_handling.on_env_error == "restart"  # ids are rebuildable
    assert henv.envs[0].spec.max_episode_steps == 7
    # js.Sampler takes such a host env as it is (and HostEnvError is at the top level).
    s = js.Sampler(henv, Zeros(henv.observation_space, henv.action_space), rollout_length=3)
    assert s.host_env is henv and js.host_envs.HostEnvError is HostEnvError
    s.close()


# --- hangs ----------------------------------------------------------------------------------


@pytest.fixture
def release():
    """An event that releases hung envs at the end of the test (their threads exit)."""
    event = threading.Event()
    yield event
    event.set()


def test_a_hung_step_times_out_is_abandoned_and_the_env_restarts(release):
    want, _ = run(step_timeout_s=5.0)
    made: list = []
    fns = factories(3, failing=1, fail=("step", 6, "hang"), release=release, made=made)
    got, henv = run(fns=fns, on_env_error="restart", step_timeout_s=0.5)
    assert got[0] == want[0] and got[2] == want[2]
    assert got[1][0] == want[1][0]
    assert got[1][1][:6] == ([200, 201, 201], [0, 0], [1.0, 0.0], [200, 201], False, True)
    assert got[1][1][6][-1] == {"env_error": "TimeoutError: step timed out after 0.5 s"}
    assert got[1][2][0][:2] == [1100, 1101]
    assert henv.failure_stats.timeouts == 1
    hung = [e for e in made if e.tag == 0 and e.idx == 1][0]
    henv.close()
    assert not hung.closed  # abandoned: never touched again, not even closed
    assert henv.failure_stats.abandoned == 1
    (thread,) = henv._failures.abandoned_threads()
    assert thread.is_alive() and thread.daemon
    release.set()
    thread.join(5)
    assert not thread.is_alive()  # the abandoned worker exits once the call returns


def test_a_hung_first_reset_is_retried_on_a_rebuilt_env(release):
    fns = factories(2, failing=0, fail=("reset", 1, "hang"), release=release)
    henv = GymnasiumHostEnv(fns, on_env_error="restart", step_timeout_s=0.3)
    first = henv.poll()
    assert first.obs[0]["default_agent"].tolist() == [0, 1100]
    assert henv.failure_stats.last_error == "env 0 reset: TimeoutError: reset timed out after 0.3 s"
    henv.close()


def test_hangs_beyond_max_abandoned_threads_raise(release):
    fns = factories(2, failing=0, fail=("step", 1, "hang"), release=release)
    henv = GymnasiumHostEnv(
        fns, on_env_error="restart", step_timeout_s=0.2, max_abandoned_threads=0
    )
    with pytest.raises(HostEnvError, match="max_abandoned_threads=0"):
        sampler(henv).sample(())


def test_a_hang_in_raise_mode_raises_and_the_env_refuses_to_go_on(release):
    fns = factories(2, failing=0, fail=("step", 1, "hang"), release=release)
    henv = GymnasiumHostEnv(fns, step_timeout_s=0.2)
    s = sampler(henv)
    with pytest.raises(HostEnvError, match=r"sub-env 0 failed in step\(\): TimeoutError"):
        s.sample(())
    with pytest.raises(HostEnvError, match=r"timed out in step\(\).*close this env"):
        s.sample(())
    henv.close()


# --- bad observations, close ---------------------------------------------------------------


def test_nan_observations_are_failures_with_check_observations():
    fns = factories(2, failing=1, fail=("step", 6, "nan"))
    got, henv = run(n=2, fns=fns, on_env_error="restart", check_observations=True)
    ep = got[1][1]
    assert ep[0] == [200, 201, 201] and ep[5]
    assert ep[6][-1]["env_error"].startswith("ValueError: observation['default_agent']")
    assert "NaN" in ep[6][-1]["env_error"]
    # Without the check a NaN passes through as the env sent it (the sampler records it).
    got, _ = run(n=2, fns=factories(2, failing=1, fail=("step", 6, "nan")))
    assert np.isnan(got[1][1][0][2])


class WrongShape(Flaky):
    def step(self, action):
        obs, *rest = super().step(action)
        return (np.zeros(5, np.float32) if self.t == 2 else obs, *rest)


def test_wrong_observation_shapes_raise_or_are_failures():
    s = sampler(GymnasiumHostEnv([WrongShape], on_env_error="restart"))
    with pytest.raises(ValueError, match=r"env 0: observation\['default_agent'\] shape \(5,\)"):
        s.sample(())  # unchecked: the sampler's own check
    henv = GymnasiumHostEnv([WrongShape], on_env_error="drop", check_observations=True)
    eps = by_env(sampler(henv).sample(()))[0]
    assert eps[0][0] == [100, 101, 101] and "shape (5,)" in eps[0][6][-1]["env_error"]


def test_close_closes_every_env_and_reports_the_ones_that_failed():
    made: list = []
    henv = GymnasiumHostEnv(factories(3, made=made))
    made[0].close_error = made[2].close_error = True
    with pytest.raises(HostEnvError, match=r"sub-envs \[0, 2\] raised while closing") as info:
        henv.close()
    assert all(e.closed for e in made) and info.value.method == "close"
    assert isinstance(info.value.__cause__, OSError)
    henv.close()  # idempotent
    vec = GymnasiumVectorHostEnv(vector_factory(2))
    vec._vec.envs[1].close_error = True
    with pytest.raises(HostEnvError, match="the vector env raised while closing: OSError"):
        vec.close()


# --- multi-agent --------------------------------------------------------------------------


def test_multi_agent_restart_ends_every_live_agent_truncated():
    from tests.host_envs.test_gymnasium import AGENTS, TurnDictEnv, _ma_policy

    class Failing(TurnDictEnv):
        """TurnDictEnv with obs[0] = 100 idx + 10 tag + k; raises at step ``fail_at``."""

        def __init__(self, idx, tag=0, fail_at=None):
            super().__init__()
            self.idx, self.tag, self.fail_at, self.steps = idx, tag, fail_at, 0

        def _obs(self, a):
            return np.array(
                [100 * self.idx + 10 * self.tag + self.k, self.t, AGENTS.index(a)], np.float32
            )

        def step(self, actions):
            self.steps += 1
            if self.steps == self.fail_at:
                raise RuntimeError("physics exploded")
            return super().step(actions)

    built = [0]

    def flaky():  # sub-env 0: its first object fails at env step 3 (a1 waits, hanging)
        built[0] += 1
        return Failing(0, built[0] - 1, 3 if built[0] == 1 else None)

    def episodes(fns, **kw):
        henv = MultiAgentDictEnv(fns, seed=0, **kw)
        s = HostSampler(henv, _ma_policy(henv), rollout_length=16, batch_sizes=(8,))
        out: dict = {}
        for ep in s.sample({"p0": (), "p1": ()}):
            # (any agent: a chunk holds only the agents that stepped in it, as RLlib's)
            if not ep.agent_episodes:
                continue
            first = next(iter(ep.agent_episodes.values())).get_observations(0)
            out.setdefault(int(first[0]) // 100, []).append(ep)
        return out, henv

    def show(ep):
        return {
            aid: (
                np.asarray(sa.get_observations()).tolist(),
                np.asarray(sa.get_actions()).tolist(),
                np.asarray(sa.get_rewards()).tolist(),
                sa.get_infos(),
                sa.is_terminated,
                sa.is_truncated,
            )
            for aid, sa in ep.agent_episodes.items()
        }

    want, _ = episodes([lambda: Failing(0), lambda: Failing(1)])
    got, henv = episodes([flaky, lambda: Failing(1)], on_env_error="restart")
    assert [show(e) for e in got[1]] == [show(e) for e in want[1]]  # the healthy sub-env
    ep, after = got[0][0], got[0][1:]
    assert len(ep) == 3 and ep.is_truncated  # (is_terminated too: every agent is done)
    assert set(ep.agent_episodes) == {"a0", "a1", "a2"}  # a1 waited with a hanging action
    ref = show(want[0][0])
    for aid, (obs, acts, rewards, infos, term, trunc) in show(ep).items():
        assert (term, trunc) == (False, True), aid
        assert obs[-1] == obs[-2], aid  # the last good observation again
        # The failed step pays 0; a1 waited since t=1 and keeps the reward of env step 2
        # (1 + its index 1 + its action (1 + 1) % 3), credited to its pending step.
        assert rewards[-1] == (4.0 if aid == "a1" else 0.0), aid
        assert infos[-1] == {"env_error": "RuntimeError: physics exploded"}, aid
        n = len(acts) - 1  # the good steps equal the run without failure
        assert (obs[:-1], acts, rewards[:-1]) == (
            ref[aid][0][: n + 1],
            ref[aid][1][: n + 1],
            ref[aid][2][:n],
        ), aid
    assert next(iter(after[0].agent_episodes.values())).get_observations(0)[0] == 11  # tag 1
    assert henv.failure_stats.restarts == 1 and built[0] == 2


# --- Gymnasium vector envs ------------------------------------------------------------------


def vector_factory(n, fail=None, release=None, made=None, kind="sync", failing=1):
    """Builds vector envs of ``n`` Flaky sub-envs; sub-env ``failing`` of the first one
    fails as ``fail`` says."""
    built = [0]

    def make():
        tag, built[0] = built[0], built[0] + 1
        fns = [
            functools.partial(Flaky, i, tag, fail if (i == failing and tag == 0) else None, release)
            for i in range(n)
        ]
        vec = (
            gym.vector.SyncVectorEnv(fns)
            if kind == "sync"
            else gym.vector.AsyncVectorEnv(fns, context="spawn")
        )
        if made is not None:
            made.append(vec)
        return vec

    return make


def test_vector_env_restart_truncates_every_running_episode():
    def episodes(**kw):
        henv = GymnasiumVectorHostEnv(vector_factory(3, **kw), on_env_error="restart")
        return by_env(sampler(henv, 14).sample(())), henv

    want, _ = episodes()
    got, henv = episodes(fail=("step", 6, "raise"))
    error = "RuntimeError: step 6 of env 1 broke"
    for i in range(3):
        assert got[i][0] == want[i][0]  # the episodes before the failure
        obs, acts, rewards, seen, term, trunc, infos = got[i][1]
        # Every running episode ends at its last good observation (201), not only env 1's.
        assert (obs, rewards, term, trunc) == ([200, 201, 201], [1.0, 0.0], False, True)
        assert infos[-1] == {"env_error": error}
        assert got[i][2][0][:2] == [1100, 1101]  # the rebuilt vector env
        assert got[i][2][6][0]["seed"] == restart_seed(0, -1, 1) + i
    assert henv.failure_stats.by_env == {-1: 1} and henv.failure_stats.restarts == 1


def test_vector_env_raise_and_drop():
    henv = GymnasiumVectorHostEnv(vector_factory(2, fail=("step", 2, "raise")))
    with pytest.raises(HostEnvError, match=r"the vector env failed in step\(\): RuntimeError"):
        sampler(henv).sample(())
    henv = GymnasiumVectorHostEnv(vector_factory(2, fail=("step", 2, "raise")), on_env_error="drop")
    s = sampler(henv)
    got = by_env(s.sample(()))
    assert [got[i][0][:2] for i in range(2)] == [([100, 101, 101], [0, 0])] * 2
    assert henv.closed
    with pytest.raises(HostEnvError, match="dropped"):
        s.sample(())


def test_sync_vector_env_hang_is_abandoned_and_the_vector_env_rebuilt(release):
    made: list = []
    make = vector_factory(2, fail=("step", 2, "hang"), release=release, made=made)
    henv = GymnasiumVectorHostEnv(make, on_env_error="restart", step_timeout_s=0.3)
    got = by_env(sampler(henv, 6).sample(()))
    for i in range(2):
        assert got[i][0][:6] == ([100, 101, 101], [0, 0], [1.0, 0.0], [100, 101], False, True)
        assert got[i][0][6][-1] == {"env_error": "TimeoutError: step timed out after 0.3 s"}
        assert got[i][1][0][:2] == [1100, 1101]  # the rebuilt vector env
    assert len(made) == 2 and not made[0].closed  # the hung one is never touched
    henv.close()
    assert made[1].closed


def test_async_vector_env_hang_terminates_the_worker_process():
    """AsyncVectorEnv's own step_wait(timeout=); the hung process is terminated, not left."""
    made: list = []
    make = vector_factory(1, fail=("step", 2, "hang"), made=made, kind="async", failing=0)
    henv = GymnasiumVectorHostEnv(make, on_env_error="drop", step_timeout_s=2.0)
    try:
        got = by_env(sampler(henv).sample(()))
        assert got[0][0][:6] == ([100, 101, 101], [0, 0], [1.0, 0.0], [100, 101], False, True)
        assert got[0][0][6][-1] == {"env_error": "TimeoutError: step timed out after 2 s"}
        assert henv.closed and henv.failure_stats.timeouts == 1
        assert not any(p.is_alive() for p in made[0].processes)
    finally:
        henv.close()
        for vec in made:
            vec.close(terminate=True)
