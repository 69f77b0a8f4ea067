"""AsyncActor: sampling overlaps the learner, every sample carries the version of the
params it used, the queue bounds how far the actor runs ahead, an actor's exception
reaches the learner, and close() stops it. Waits are on events with bounded timeouts;
nothing here asserts a duration."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.sampling import AsyncActor

WAIT = 30.0  # bound on every wait for the other thread


class Recorder:
    """A sample function that records each call (the params it got) and can be held."""

    def __init__(self, fail_at: int | None = None):
        self.calls: list = []
        self.started = [threading.Event() for _ in range(64)]
        self.release = threading.Event()
        self.release.set()
        self.fail_at = fail_at

    def __call__(self, params):
        i = len(self.calls)
        self.calls.append(params)
        self.started[i].set()
        assert self.release.wait(WAIT)
        if i == self.fail_at:
            raise ValueError(f"env broke in call {i}")
        return {"call": i, "params": params}


def test_each_sample_carries_the_version_of_the_params_it_used():
    rec = Recorder()
    with AsyncActor(rec, 0, max_queue=2) as actor:
        for _ in range(12):
            sample = actor.get(timeout=WAIT)
            assert sample.data["params"] == sample.version  # params k are version k
            assert sample.data["call"] == sample.index
            assert actor.version - sample.version <= 2 + 1  # at most max_queue + 1 old
            newest = actor.version
            assert actor.update(newest + 1) == newest + 1
    assert rec.calls == sorted(rec.calls)  # the versions the actor used only grow


def test_the_next_sample_runs_while_the_learner_learns():
    """The learner holds batch 0 and sees the actor start batch 1 before it finishes."""
    rec = Recorder()
    with AsyncActor(rec, 0) as actor:
        first = actor.get(timeout=WAIT)
        assert rec.started[1].wait(WAIT)  # sampling batch 1 while "learning" on batch 0
        actor.update(1)
        assert first.index == 0 and actor.get(timeout=WAIT).index == 1


def test_a_full_queue_stops_the_actor_until_the_learner_takes_a_sample():
    rec = Recorder()
    with AsyncActor(rec, 0, max_queue=1) as actor:
        assert rec.started[1].wait(WAIT)  # call 0 is queued, call 1 ran and waits to queue
        assert not rec.started[2].wait(0.3)  # no third call while nobody takes one
        assert len(rec.calls) == 2
        actor.get(timeout=WAIT)
        assert rec.started[2].wait(WAIT)  # room again: the actor goes on


@pytest.mark.parametrize("max_queue", [1, 4])
def test_an_actor_exception_is_raised_in_the_learner_after_the_samples_before_it(max_queue):
    """With max_queue=1 the failure waits for room behind the samples before it."""
    rec = Recorder(fail_at=2)
    actor = AsyncActor(rec, 0, max_queue=max_queue)
    assert rec.started[1].wait(WAIT)
    assert actor.get(timeout=WAIT).index == 0
    assert rec.started[2].wait(WAIT)  # call 2 fails while sample 1 waits in the queue
    assert actor.get(timeout=WAIT).index == 1
    with pytest.raises(ValueError, match="env broke in call 2") as first:
        actor.get(timeout=WAIT)
    with pytest.raises(ValueError) as again:
        actor.get(timeout=WAIT)
    assert again.value is first.value
    actor._thread.join(WAIT)
    assert not actor.alive
    actor.close()


def test_close_stops_a_blocked_actor_and_warns_about_one_inside_a_call():
    rec = Recorder()
    actor = AsyncActor(rec, 0, max_queue=1)
    assert rec.started[1].wait(WAIT)  # blocked on the full queue
    actor.close()
    assert not actor.alive
    with pytest.raises(RuntimeError, match="closed"):
        actor.get(timeout=WAIT)
    with pytest.raises(RuntimeError, match="closed"):
        actor.update(1)

    slow = Recorder()
    slow.release.clear()  # the first call does not return until released
    actor = AsyncActor(slow, 0)
    assert slow.started[0].wait(WAIT)
    with pytest.warns(RuntimeWarning, match="inside a sample call"):
        actor.close(timeout=0.1)
    slow.release.set()
    actor._thread.join(WAIT)
    assert not actor.alive


def test_get_times_out_with_a_clear_error_and_bad_arguments_are_refused():
    rec = Recorder()
    rec.release.clear()
    with AsyncActor(rec, 0) as actor:
        with pytest.raises(TimeoutError, match="within 0.1 s"):
            actor.get(timeout=0.1)
        rec.release.set()
        assert rec.started[1].wait(WAIT)  # sample 0 is queued
        assert actor.get(timeout=0).index == 0  # timeout=0 still takes what is there
    with pytest.raises(ValueError, match="max_queue"):
        AsyncActor(rec, 0, max_queue=0)
    with pytest.raises(TypeError, match="callable"):
        AsyncActor(42, 0)  # type: ignore[arg-type]


def test_params_go_to_the_actor_device_and_samples_to_the_learner_device():
    actor_dev, learner_dev = jax.devices()[:2]

    @jax.jit
    def sample(params):
        return params * 2.0

    def checked(params):
        assert params.devices() == {actor_dev}
        return sample(params)

    with AsyncActor(
        checked, jnp.ones(3), actor_device=actor_dev, learner_device=learner_dev
    ) as actor:
        actor.update(jnp.full(3, 5.0))
        for _ in range(3):
            s = actor.get(timeout=WAIT)
            assert s.data.devices() == {learner_dev}
            np.testing.assert_array_equal(
                np.asarray(s.data), 2.0 * (1.0 if s.version == 0 else 5.0)
            )


def test_a_real_samplers_action_logp_matches_the_params_its_version_names():
    """DeviceSampler on the actor's device, params changed by the learner every batch: each
    batch's recorded action_logp is that of its tagged version's params (and not of the
    learner's newest ones, when those differ)."""
    env = js.make("CartPole-v1")
    policy = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(8,))
    sampler = js.Sampler(env, policy, num_envs=4, rollout_length=8, devices=[jax.devices()[0]])
    versions = {0: policy.init(jax.random.PRNGKey(0))}

    def logp(params, obs, actions):
        logits = policy.forward(params, jnp.asarray(obs))[0]
        return np.asarray(jax.nn.log_softmax(logits)[np.arange(len(actions)), actions])

    stale = 0
    with AsyncActor(lambda p: sampler.sample_batch(p), versions[0], max_queue=1) as actor:
        for k in range(1, 7):
            s = actor.get(timeout=WAIT)
            rows = s.data["default_policy"]
            want = logp(versions[s.version], rows["obs"], rows["actions"])
            np.testing.assert_allclose(rows["action_logp"], want, rtol=1e-5, atol=1e-5)
            newest = versions[actor.version]
            if s.version != actor.version:
                stale += 1
                assert not np.allclose(logp(newest, rows["obs"], rows["actions"]), want)
            versions[k] = jax.tree.map(lambda x, k=k: x + 0.3 * k, versions[0])
            actor.update(versions[k])
    assert stale >= 1  # the actor ran ahead at least once (it samples while we "learn")
    sampler.close()


def test_the_docs_example_runs():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "training.md").read_text()
    section = text.split("**Collection that overlaps the learner**", 1)[1]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    scope: dict = {}
    exec(compile(block, "docs/guides/training.md (AsyncActor)", "exec"), scope)
    sample, actor = scope["sample"], scope["actor"]
    assert sample.index == 2 and sample.version <= 2 and not actor.alive
