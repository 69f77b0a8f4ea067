"""Zero-copy hand-off to torch learners on CPU: RLlib's own learner conversion
(TorchLearner._convert_batch_type) of a sampled Spread batch shares every numeric column's
memory; a float64 column is the copy learner_copies predicts; to_torch shares numpy and
(through DLPack) JAX memory."""

from __future__ import annotations

import types

import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("ray.rllib", reason="needs ray[rllib] (the rllib extra)")
torch = pytest.importorskip("torch", reason="needs torch (the rllib extra)")

from ray.rllib.core.learner.torch.torch_learner import TorchLearner  # noqa: E402
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch  # noqa: E402

import jaxsampler as js  # noqa: E402
from jaxsampler.integrations.rllib import to_rllib  # noqa: E402
from jaxsampler.integrations.rllib.torch_handoff import (  # noqa: E402
    learner_copies,
    tensor_of,
    to_torch,
)


@pytest.fixture(scope="module")
def batch():
    env = js.make("Spread-v0")
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    s = js.Sampler(env, pol, num_envs=4, rollout_length=6, seed=0)
    return to_rllib(s.sample_batch(()))


def numeric(cols):
    return {
        k: v
        for k, v in cols.items()
        if isinstance(v, np.ndarray) and v.dtype != object and v.dtype.kind not in "USV"
    }


def shares(tensor, array):
    return tensor.data_ptr() == array.__array_interface__["data"][0] and np.shares_memory(
        tensor.numpy(), array
    )


def learner_convert(batch):
    """RLlib's TorchLearner conversion itself (it reads only the learner's device)."""
    me = types.SimpleNamespace(_device=torch.device("cpu"))
    return TorchLearner._convert_batch_type(me, batch)


def test_rllibs_learner_conversion_shares_every_numeric_column(batch):
    assert isinstance(batch, MultiAgentBatch) and learner_copies(batch) == []
    out = learner_convert(batch)
    for pid, cols in batch.policy_batches.items():
        cols = numeric(cols)
        assert {"obs", "new_obs", "actions", "rewards"} <= set(cols)
        for k, arr in cols.items():
            t = out.policy_batches[pid][k]
            assert isinstance(t, torch.Tensor) and shares(t, arr), k
            np.testing.assert_array_equal(t.numpy(), arr)


def test_a_float64_column_is_the_predicted_copy(batch):
    pid, cols = next(iter(batch.policy_batches.items()))
    wide = dict(cols)
    wide["rewards"] = cols["rewards"].astype(np.float64)
    wide_batch = MultiAgentBatch({pid: SampleBatch(wide)}, batch.count)
    assert learner_copies(wide_batch) == [(pid, "rewards", "float64 cast to float32")]
    t = learner_convert(wide_batch).policy_batches[pid]["rewards"]
    assert t.dtype == torch.float32 and not shares(t, wide["rewards"])
    reversed_obs = {"obs": cols["obs"][::-1]}
    assert learner_copies(reversed_obs) == [(None, "obs", "negative stride")]
    np.testing.assert_array_equal(to_torch(reversed_obs)[None]["obs"].numpy(), cols["obs"][::-1])


def test_to_torch_shares_numpy_and_jax_memory(batch):
    pid, cols = next(iter(batch.policy_batches.items()))
    out = to_torch(batch)[pid]
    for k, arr in numeric(cols).items():
        assert shares(out[k], arr), k
    assert out["infos"] is cols["infos"]  # left as is, as RLlib leaves it
    x = jnp.arange(12, dtype=jnp.float32).reshape(3, 4)
    t = tensor_of(x)
    assert t.data_ptr() == x.unsafe_buffer_pointer()  # DLPack: the same buffer on CPU
    np.testing.assert_array_equal(t.numpy(), np.asarray(x))
    nested = to_torch({"obs": {"a": np.ones(3, np.float32)}, "id": np.array(["x"])})[None]
    assert isinstance(nested["obs"]["a"], torch.Tensor) and nested["id"].dtype.kind == "U"


def test_bad_input_is_named():
    with pytest.raises(TypeError, match="got int"):
        to_torch(3)
