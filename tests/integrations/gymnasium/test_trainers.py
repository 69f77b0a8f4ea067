"""Gymnasium-based trainers take the faces as they are: Stable-Baselines3 (its env checker and
PPO), a CleanRL-style PPO loop on the vector API, TorchRL's GymWrapper."""

from __future__ import annotations

import warnings

import gymnasium
import numpy as np
import pytest
import torch

import jaxsampler as js

torch.set_num_threads(1)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_sb3_check_env_accepts_the_face(env_id):
    from stable_baselines3.common.env_checker import check_env

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(js.to_gymnasium(env_id))  # raises where SB3 refuses an env
    # SB3 warns about unnormalized Box actions (Pendulum's [-2, 2]); nothing about the face.
    assert all("action space" in str(w.message) for w in caught), [str(w.message) for w in caught]


def test_sb3_ppo_learns_on_the_face_with_sb3s_own_vec_env():
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    venv = make_vec_env(lambda: js.to_gymnasium("CartPole-v1"), n_envs=2, seed=0)
    model = PPO("MlpPolicy", venv, n_steps=256, batch_size=128, n_epochs=2, seed=0, device="cpu")
    model.learn(total_timesteps=2048)
    assert model.num_timesteps == 2048
    episodes = list(model.ep_info_buffer)  # SB3's Monitor saw whole episodes through the face
    assert len(episodes) >= 10
    # CartPole: reward 1 per step, so every episode's return equals its length
    assert all(ep["r"] == ep["l"] and 8 <= ep["l"] <= 500 for ep in episodes)


def test_cleanrl_style_ppo_loop_on_the_vector_face():
    """A PPO loop as CleanRL writes it, on the gymnasium.vector API only (NEXT_STEP: the
    transition out of a finished episode is the reset step, masked out of the loss)."""
    from torch import nn
    from torch.distributions import Categorical

    torch.manual_seed(0)
    num_envs, num_steps = 4, 32
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. a missing metadata["autoreset_mode"]
        envs = gymnasium.wrappers.vector.RecordEpisodeStatistics(
            js.to_gymnasium("CartPole-v1", num_envs=num_envs)
        )
    assert envs.metadata["autoreset_mode"] == gymnasium.vector.AutoresetMode.NEXT_STEP
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    n_actions = int(envs.single_action_space.n)
    actor = nn.Sequential(nn.Linear(obs_dim, 32), nn.Tanh(), nn.Linear(32, n_actions))
    critic = nn.Sequential(nn.Linear(obs_dim, 32), nn.Tanh(), nn.Linear(32, 1))
    params = [*actor.parameters(), *critic.parameters()]
    optimizer = torch.optim.Adam(params, lr=2.5e-4)

    obs_buf = torch.zeros((num_steps, num_envs, obs_dim))
    act_buf = torch.zeros((num_steps, num_envs), dtype=torch.long)
    logp_buf, rew_buf, val_buf = (torch.zeros((num_steps, num_envs)) for _ in range(3))
    done_buf, valid_buf = torch.zeros((num_steps, num_envs)), torch.zeros((num_steps, num_envs))
    next_obs = torch.tensor(envs.reset(seed=0)[0])
    next_done = torch.zeros(num_envs)
    episode_returns, episode_lengths, losses = [], [], []
    for _update in range(3):
        for t in range(num_steps):
            obs_buf[t] = next_obs
            valid_buf[t] = 1.0 - next_done  # after an episode ends, the next step is its reset
            with torch.no_grad():
                dist = Categorical(logits=actor(next_obs))
                action = dist.sample()
                logp_buf[t], val_buf[t] = dist.log_prob(action), critic(next_obs).squeeze(-1)
            act_buf[t] = action
            obs, reward, terminated, truncated, infos = envs.step(action.numpy())
            rew_buf[t] = torch.tensor(reward, dtype=torch.float32)
            next_done = torch.tensor(np.logical_or(terminated, truncated), dtype=torch.float32)
            done_buf[t] = torch.tensor(terminated, dtype=torch.float32)
            next_obs = torch.tensor(obs)
            if "episode" in infos:
                episode_returns += infos["episode"]["r"][infos["_episode"]].tolist()
                episode_lengths += infos["episode"]["l"][infos["_episode"]].tolist()
        with torch.no_grad():  # GAE, bootstrapping through truncations, cut at terminations
            next_value = critic(next_obs).squeeze(-1)
            advantages, last = torch.zeros_like(rew_buf), torch.zeros(num_envs)
            for t in reversed(range(num_steps)):
                value_tp1 = next_value if t == num_steps - 1 else val_buf[t + 1]
                valid_tp1 = 1.0 - next_done if t == num_steps - 1 else valid_buf[t + 1]
                delta = rew_buf[t] + 0.99 * value_tp1 * (1.0 - done_buf[t]) - val_buf[t]
                last = delta + 0.99 * 0.95 * (1.0 - done_buf[t]) * valid_tp1 * last
                advantages[t] = last
            returns = advantages + val_buf
        for _epoch in range(2):
            dist = Categorical(logits=actor(obs_buf))
            ratio = torch.exp(dist.log_prob(act_buf) - logp_buf)
            clipped = torch.clamp(ratio, 0.8, 1.2)
            pg = -torch.min(ratio * advantages, clipped * advantages)
            v_loss = 0.5 * (critic(obs_buf).squeeze(-1) - returns) ** 2
            loss = ((pg + 0.5 * v_loss) * valid_buf).sum() / valid_buf.sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
    assert np.isfinite(losses).all() and len(losses) == 6
    assert len(episode_returns) >= 5
    assert episode_returns == [float(n) for n in episode_lengths]  # reward 1 per step
    assert min(episode_lengths) >= 8
    assert valid_buf.sum() < valid_buf.numel()  # reset steps happened and were masked


def test_torchrl_gym_wrapper_accepts_the_face():
    from torchrl.envs import GymWrapper
    from torchrl.envs.utils import check_env_specs

    env = GymWrapper(js.to_gymnasium("CartPole-v1"))
    check_env_specs(env, seed=0)  # TorchRL's own check: specs against a real rollout
    rollout = env.rollout(40, break_when_any_done=False)
    obs = rollout["observation"].numpy()
    assert obs.shape == (40, 4) and obs.dtype == np.float32
    assert rollout["next", "reward"].sum().item() > 0
