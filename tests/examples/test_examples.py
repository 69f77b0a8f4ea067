"""Smoke tests: each example runs a few iterations at tiny sizes (no learning threshold here;
learning results are in benchmarks/results/ppo.md)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from examples import ppo, ppo_host, ppo_multiagent


@pytest.mark.parametrize(
    "env_id, sampler",
    [("CartPole-v1", "jaxsampler"), ("CartPole-v1", "handwritten"), ("Pendulum-v1", "jaxsampler")],
)
def test_ppo_example_runs(env_id, sampler, tmp_path):
    out = tmp_path / "ppo.json"
    rc = ppo.main(
        [
            "--env",
            env_id,
            "--sampler",
            sampler,
            "--seeds",
            "2",
            "--total-timesteps",
            "512",
            "--num-envs",
            "2",
            "--rollout-length",
            "64",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["seeds"] == 2 and res["env_steps_per_seed"] == 512
    curve = np.asarray(res["learning_curve_per_seed"], dtype=float)  # None: no episode finished
    # An update in which no episode finished has no mean return (None), never a made-up 0:
    # Pendulum's 200-step episodes first finish in the 4th update of 2 x 64 steps.
    finished = np.isfinite(curve)
    assert curve.shape == (2, 4) and finished[:, -1].all() and not (curve[finished] == 0).any()
    assert res["env_steps_per_s"] > 0


def test_ppo_host_example_runs(tmp_path):
    out = tmp_path / "host.json"
    assert (
        ppo_host.main(
            [
                "--total-timesteps",
                "600",
                "--num-envs",
                "2",
                "--rollout-length",
                "64",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    res = json.loads(out.read_text())
    assert res["env_steps"] >= 600 and res["env_steps_per_s"] > 0


def test_ppo_multiagent_example_runs(tmp_path):
    out = tmp_path / "ma.json"
    assert (
        ppo_multiagent.main(
            [
                "--total-timesteps",
                "400",
                "--num-envs",
                "2",
                "--rollout-length",
                "32",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    res = json.loads(out.read_text())
    assert res["env_steps"] >= 400 and 0 < res["agent_steps"] <= 4 * res["env_steps"]
    assert np.isfinite(res["final_return_per_agent"])


def test_batch_gae_matches_the_trajectory_gae():
    """The host example's flat-batch GAE equals js.compute_gae on the same data."""
    import jax

    import jaxsampler as js

    env = js.make("CartPole-v1")
    pol = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(8,))
    params = pol.init(jax.random.PRNGKey(0))
    s = js.Sampler(env, pol, num_envs=3, rollout_length=40, seed=5, episode_lookback_horizon=0)
    s.sample_batch(params)  # start mid-episode
    sb = s.sample_batch(params)["default_policy"]
    _, nv, _ = pol.forward(params, sb["new_obs"])
    ends = np.ones(sb.count, bool)
    ends[:-1] = sb["eps_id"][1:] != sb["eps_id"][:-1]
    adv = np.asarray(
        ppo_host.batch_gae(sb["rewards"], sb["vf_preds"], nv, sb["terminateds"], ends, 0.99, 0.95)
    )
    # Reference: the same steps' advantages from the device-side GAE, matched by (eps_id, t).
    s2 = js.Sampler(env, pol, num_envs=3, rollout_length=40, seed=5, episode_lookback_horizon=0)
    s2.sample_batch(params)
    traj = s2._dispatch(params, topup=False)  # the sampler's next rollout chunk
    _, last_value, _ = pol.forward(params, s2._state.obs)
    ref = np.asarray(js.compute_gae(traj, last_value, 0.99, 0.95).advantages)[..., 0]
    # Each live (step, env) cell of the trajectory: its env, episode number in that env
    # and step in that episode, walked with the rollout's documented counters.
    obs, is_reset = np.asarray(traj.obs[:-1, :, 0]), np.asarray(traj.is_reset)
    count = np.asarray(traj.episode_count_0).copy()
    step = np.asarray(traj.episode_step_0).copy()
    ref_at: dict[tuple[int, int, int], float] = {}  # (env, episode, t) -> advantage
    episode_of_obs: dict[bytes, tuple[int, int]] = {}  # a cell's observation -> (env, episode)
    for tau, e in np.ndindex(*is_reset.shape):
        if is_reset[tau, e]:  # a reset step: the next step starts the env's next episode
            count[e], step[e] = count[e] + 1, 0
            continue
        ref_at[(e, int(count[e]), int(step[e]))] = float(ref[tau, e])
        episode_of_obs[obs[tau, e].tobytes()] = (e, int(count[e]))
        step[e] += 1
    assert len(ref_at) == sb.count == len(adv)
    # Every batch row is matched by (eps_id, t); which env episode an eps_id names is
    # read off its rows' observations (the same one for all of them).
    episode_of_id: dict[str, tuple[int, int]] = {}
    for i in range(sb.count):
        episode = episode_of_obs[np.asarray(sb["obs"][i], np.float32).tobytes()]
        assert episode_of_id.setdefault(str(sb["eps_id"][i]), episode) == episode
        expected = ref_at[(*episode, int(sb["t"][i]))]
        np.testing.assert_allclose(adv[i], expected, rtol=1e-4, atol=1e-4, err_msg=f"row {i}")
    assert len(episode_of_id) > 3  # several episodes, some cut by the call boundary


def test_ppo_example_records_a_video_of_the_trained_policy(tmp_path, capsys):
    video = tmp_path / "cartpole.gif"
    args = ["--seeds", "1", "--total-timesteps", "256", "--num-envs", "2", "--rollout-length"]
    assert ppo.main([*args, "32", "--video", str(video), "--quiet"]) == 0
    frames = int(capsys.readouterr().out.split("video: ")[1].split("(")[1].split(" frames")[0])
    assert video.stat().st_size > 0 and frames >= 2  # an episode: first frame to final
    iio = pytest.importorskip("imageio.v3")
    # a GIF encoder may merge identical consecutive frames (a pole that barely moves)
    assert 2 <= len(iio.imread(video, index=None)) <= frames
    for bad, why in (("c.png", "must end in .mp4 or .gif"), ("no/c.gif", "does not exist")):
        with pytest.raises(SystemExit) as exited:  # refused before any training
            ppo.main([*args, "32", "--video", str(tmp_path / bad)])
        assert exited.value.code == 2 and why in capsys.readouterr().err


def test_ppo_groups_example_trains_each_groups_policy_on_its_own_spaces(tmp_path):
    from examples import ppo_groups

    out = tmp_path / "groups.json"
    argv = ["--train", "both", "--total-timesteps", "256", "--num-envs", "2"]
    argv += ["--rollout-length", "32", "--json", str(out), "--quiet"]
    assert ppo_groups.main(argv) == 0
    res = json.loads(out.read_text())
    assert res["env_steps"] >= 256 and res["train"] == "both"
    assert all(0.0 <= c <= 1.0 for _, c, _ in res["curve"])
