"""jaxsampler.integrations.video: rendered episodes in one jitted call, against by-hand
stepping of the
env (same keys and actions), and the MP4/GIF files read back; bad paths fail before any
rollout runs."""

from __future__ import annotations

import base64
import dataclasses
import re
import sys
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

import jaxsampler as js
from jaxsampler.envs.base import SingleAgentEnv
from jaxsampler.integrations import video
from jaxsampler.policies.base import Policy
from jaxsampler.spaces import Box, Discrete
from jaxsampler.types import NoInfo
from tests.fakes import CountingPolicy, FakeEnv, FakeParams, TurnEnv, expected_episode

iio = pytest.importorskip("imageio.v3", reason="the video extra (imageio) is not installed")

H, W = 6, 8


def _fake_frame(time: jax.Array, tag: jax.Array) -> jax.Array:
    """A red column at ``time % W`` on a green level that encodes ``tag``."""
    img = jnp.zeros((H, W, 3), jnp.uint8)
    img = img.at[:, time % W, 0].set(255)
    return img.at[..., 1].set((tag * 250).astype(jnp.uint8))


def _np_frame(time: int, tag: float) -> np.ndarray:
    img = np.zeros((H, W, 3), np.uint8)
    img[:, time % W, 0] = 255
    img[..., 1] = np.asarray(np.float32(tag) * np.float32(250)).astype(np.uint8)
    return img


@dataclasses.dataclass(frozen=True)
class RenderFake(FakeEnv):
    """FakeEnv (episodes of 3 or 5 steps, by tag) that renders its time and tag."""

    @property
    def can_render(self) -> bool:
        return True

    @property
    def render_shape(self) -> tuple[int, int]:
        return (H, W)

    def render(self, state: Any, params: Any = None) -> jax.Array:
        return _fake_frame(state.time, state.tag)


@dataclasses.dataclass(frozen=True)
class RenderTurn(TurnEnv):
    """Two agents taking turns, the world drawn as one frame per env step."""

    num_agents: ClassVar[int] = 2

    @property
    def can_render(self) -> bool:
        return True

    def render(self, state: Any, params: Any = None) -> jax.Array:
        return _fake_frame(state.time, state.time.astype(jnp.float32) / 8)


@dataclasses.dataclass(frozen=True)
class TracedPolicy(CountingPolicy):
    """CountingPolicy that counts how often it is traced (called in Python)."""

    calls: ClassVar[list[int]] = [0]

    def __call__(self, params, obs, key, state):
        TracedPolicy.calls[0] += 1
        return super().__call__(params, obs, key, state)


def policy_for(env: Any) -> CountingPolicy:
    return CountingPolicy(env.observation_space, env.action_space)


def by_hand(
    env: Any, policy: Any, key: jax.Array, n: int, max_steps: int, params: Any = ()
) -> list[np.ndarray]:
    """Each episode's frames by stepping one unbatched env in Python with the documented
    keys (evaluate's) and the policy's actions; stops at the episode's end."""
    k_reset, k_step, k_pol, _ = jax.random.split(key, 4)
    env_params = env.default_params
    out = []
    for i in range(n):
        state, ts = env.reset(jax.random.fold_in(k_reset, i), env_params)
        pstate = policy.initial_state((1, env.num_agents))
        frames = [np.asarray(env.render(state, env_params))]
        for t in range(max_steps):
            action, _, pstate = policy(params, ts.obs[None], jax.random.fold_in(k_pol, t), pstate)
            k = jax.random.fold_in(jax.random.fold_in(k_step, i), t)
            state, ts = env.step(k, state, action[0], env_params)
            frames.append(np.asarray(env.render(state, env_params)))
            if bool(np.all(np.asarray(ts.terminated | ts.truncated))):
                break
        out.append(np.stack(frames))
    return out


KEY = jax.random.PRNGKey(3)


def test_frames_equal_by_hand_stepping_and_are_masked_after_the_end():
    env = RenderFake()
    policy = policy_for(env)
    frames, lengths = video.rollout_frames(env, policy, (), KEY, 5, explore=True)
    frames, lengths = np.asarray(frames), np.asarray(lengths)
    limit = FakeParams().max_steps_in_episode
    assert frames.shape == (5, limit + 1, H, W, 3) and frames.dtype == np.uint8
    ref = by_hand(env, policy, KEY, 5, limit)
    # The episode lengths follow from each episode's tag (closed form) ...
    tags = [float(r[0, 0, 0, 1]) / 250 for r in ref]
    assert sorted(set(lengths.tolist())) == [3, 5], "both episode kinds must occur"
    for i in range(5):
        n = int(lengths[i])
        assert n == len(ref[i]) - 1 == expected_episode(tags[i])[0]
        np.testing.assert_array_equal(frames[i, : n + 1], ref[i])
        assert not frames[i, n + 1 :].any(), "frames after the episode's end are zeros"
        # ... and every frame shows its own state: the red column walks with time.
        for t in range(n + 1):
            np.testing.assert_array_equal(frames[i, t], _np_frame(t, tags[i]))


def test_lengths_equal_evaluate_on_the_same_key():
    env = RenderFake()
    policy = policy_for(env)
    _, lengths = video.rollout_frames(env, policy, (), KEY, 6, explore=True)
    result = js.evaluate(env, policy, (), 6, KEY, deterministic=False)
    np.testing.assert_array_equal(np.asarray(lengths), result.lengths)


def test_max_steps_cuts_episodes():
    env = RenderFake()
    frames, lengths = video.rollout_frames(
        env, policy_for(env), (), KEY, 3, max_steps=2, explore=True
    )
    assert frames.shape[:2] == (3, 3)
    np.testing.assert_array_equal(np.asarray(lengths), [2, 2, 2])
    ref = by_hand(env, policy_for(env), KEY, 3, 2)
    for i in range(3):
        np.testing.assert_array_equal(np.asarray(frames[i]), ref[i])


def test_multi_agent_world_is_one_frame_per_env_step():
    env = RenderTurn(length=4)
    policy = policy_for(env)
    frames, lengths = video.rollout_frames(env, policy, (), KEY, 2, max_steps=6, explore=True)
    np.testing.assert_array_equal(np.asarray(lengths), [4, 4])
    ref = by_hand(env, policy, KEY, 2, 6)
    for i in range(2):
        assert len(ref[i]) == 5
        np.testing.assert_array_equal(np.asarray(frames[i, :5]), ref[i])
        assert not np.asarray(frames[i, 5:]).any()


def test_greedy_needs_an_explore_switch():
    env = RenderFake()
    with pytest.raises(TypeError, match="explore=True"):
        video.rollout_frames(env, policy_for(env), (), KEY, 1)


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # the reader runs ffmpeg
def test_record_video_writes_gif_and_mp4_that_read_back(tmp_path):
    env = RenderFake()
    policy = policy_for(env)
    _, lengths = video.rollout_frames(env, policy, (), jax.random.PRNGKey(1), 2, explore=True)
    count = int(np.sum(np.asarray(lengths) + 1))
    gif = video.record_video(env, policy, (), tmp_path / "a.gif", 2, seed=1, explore=True)
    assert gif.shape == (count, H, W, 3) and gif.dtype == np.uint8
    back = iio.imread(tmp_path / "a.gif", index=None)
    assert back.shape[:3] == (count, H, W)
    np.testing.assert_array_equal(back[..., :3], gif)  # few colors: the palette is exact
    mp4 = video.record_video(env, policy, (), tmp_path / "a.MP4", 2, seed=1, explore=True)
    np.testing.assert_array_equal(mp4, gif)
    import imageio.v2 as iio2

    reader = iio2.get_reader(tmp_path / "a.MP4", format="FFMPEG")
    try:
        assert reader.count_frames() == count
        first = reader.get_data(0)
    finally:
        reader.close()
    assert first.shape == (H, W, 3)
    # Lossy, but the red column of the first frame is where the frame has it.
    assert np.argmax(first[..., 0].mean(axis=0)) == np.argmax(gif[0, ..., 0].mean(axis=0))


def test_path_none_returns_the_episodes_one_after_another():
    env = RenderFake()
    policy = policy_for(env)
    frames, lengths = video.rollout_frames(env, policy, (), jax.random.PRNGKey(0), 3, explore=True)
    out = js.integrations.record_video(env, policy, (), None, 3, seed=0, explore=True)
    want = np.concatenate([np.asarray(frames[i, : int(n) + 1]) for i, n in enumerate(lengths)])
    np.testing.assert_array_equal(out, want)


def _bad_path_cases(tmp_path):
    afile = tmp_path / "file.txt"
    afile.write_text("x")
    (tmp_path / "adir.gif").mkdir()
    return [
        (tmp_path / "missing" / "v.mp4", FileNotFoundError, "does not exist"),
        (afile / "v.gif", NotADirectoryError, "not a directory"),
        (tmp_path / "adir.gif", IsADirectoryError, "is a directory"),
        (tmp_path / "v.avi", ValueError, "unsupported file type"),
        (tmp_path / "v", ValueError, "unsupported file type"),
    ]


def test_bad_paths_fail_before_any_rollout(tmp_path):
    env = RenderFake()
    policy = TracedPolicy(env.observation_space, env.action_space)
    TracedPolicy.calls[0] = 0
    for path, err, msg in _bad_path_cases(tmp_path):
        with pytest.raises(err, match=msg) as e:
            js.integrations.record_video(env, policy, (), path, explore=True)
        assert str(path) in str(e.value)
    assert TracedPolicy.calls[0] == 0, "nothing may be traced or sampled before the path check"
    assert not list(tmp_path.glob(".jaxsampler-probe-*")), "the writability probe is removed"


def test_unwritable_directory_fails_before_any_rollout(tmp_path, monkeypatch):
    # The probe file cannot be created (as in a read-only directory; chmod does not stop
    # root, so the refusal is simulated where the library asks the OS for a file).
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    env = RenderFake()
    policy = TracedPolicy(env.observation_space, env.action_space)
    TracedPolicy.calls[0] = 0
    monkeypatch.setattr(video.tempfile, "mkstemp", refuse)
    path = tmp_path / "v.gif"
    with pytest.raises(PermissionError, match="not writable") as e:
        js.integrations.record_video(env, policy, (), path, explore=True)
    assert str(path) in str(e.value) and TracedPolicy.calls[0] == 0
    assert not path.exists()


def test_env_that_cannot_render_is_named(tmp_path):
    env = FakeEnv()
    with pytest.raises(TypeError, match=r"env FakeEnv cannot render"):
        js.integrations.record_video(env, policy_for(env), (), tmp_path / "v.gif", explore=True)
    with pytest.raises(TypeError, match=r"env FakeEnv cannot render"):
        video.rollout_frames(env, policy_for(env), (), KEY, explore=True)


def test_missing_imageio_names_the_extra(tmp_path, monkeypatch):
    env = RenderFake()
    policy = TracedPolicy(env.observation_space, env.action_space)
    TracedPolicy.calls[0] = 0
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)
    with pytest.raises(ImportError, match=re.escape('pip install -e ".[video]"')):
        js.integrations.record_video(env, policy, (), tmp_path / "v.mp4", explore=True)
    monkeypatch.setitem(sys.modules, "imageio", None)
    with pytest.raises(ImportError, match=re.escape('pip install -e ".[video]"')):
        js.integrations.record_video(env, policy, (), tmp_path / "v.gif", explore=True)
    assert TracedPolicy.calls[0] == 0


def test_no_recompilation_across_seeds_and_params():
    env = RenderFake()
    policy = TracedPolicy(env.observation_space, env.action_space)
    video.rollout_frames(env, policy, (), KEY, 2, explore=True)
    traced = TracedPolicy.calls[0]
    video.rollout_frames(env, policy, (), jax.random.PRNGKey(11), 2, explore=True)
    params = FakeParams(term_len=2)
    _, lengths = video.rollout_frames(env, policy, (), KEY, 2, env_params=params, explore=True)
    assert TracedPolicy.calls[0] == traced, "a new key or new param values must not retrace"
    assert set(np.asarray(lengths).tolist()) <= {2, 5}


def test_to_html_embeds_the_video():
    frames = np.asarray(
        js.integrations.record_video(
            RenderFake(), policy_for(RenderFake()), (), None, 2, explore=True
        )
    )
    media = video.to_html(frames, fps=10, format="gif")
    m = re.search(r'<img src="data:image/gif;base64,([^"]+)"', media._repr_html_())
    assert m is not None
    data = base64.b64decode(m.group(1))
    assert len(data) == media.num_bytes
    back = iio.imread(data, index=None, extension=".gif")
    np.testing.assert_array_equal(back[..., :3], frames)
    small = video.to_html(np.repeat(np.repeat(frames, 4, 1), 4, 2), downscale=2, width=320)
    assert '<video width="320"' in str(small) and "data:video/mp4;base64," in str(small)
    with pytest.raises(ValueError, match="format"):
        video.to_html(frames, format="webm")


def test_to_html_of_a_file(tmp_path):
    path = tmp_path / "v.gif"
    js.integrations.record_video(RenderFake(), policy_for(RenderFake()), (), path, explore=True)
    media = video.to_html(path)
    assert base64.b64encode(path.read_bytes()).decode() in str(media)


# --------------------------------------------------------------------------- jaxsampler check


@pytest.fixture
def registered(monkeypatch):
    from jaxsampler.envs import registry

    monkeypatch.setitem(registry.REGISTRY, "RenderFake-v0", RenderFake)
    monkeypatch.setitem(registry.REGISTRY, "Fake-v0", FakeEnv)


def test_check_command_writes_the_first_frame(registered, tmp_path, monkeypatch, capsys):
    from jaxsampler import cli

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    assert cli.main(["check", "RenderFake-v0"]) == 0
    out = capsys.readouterr().out
    assert "check_env(RenderFake): OK" in out
    path = tmp_path / "jaxsampler-check-RenderFake-v0.png"
    assert f"first frame: {path}" in out.splitlines()
    # The first state after reset(PRNGKey(0)): time 0 and that reset's tag.
    state, _ = RenderFake().reset(jax.random.PRNGKey(0))
    np.testing.assert_array_equal(iio.imread(path), _np_frame(0, float(state.tag)))
    custom = tmp_path / "f.png"
    assert cli.main(["check", "RenderFake-v0", "--frame", str(custom)]) == 0
    assert f"first frame: {custom}" in capsys.readouterr().out and custom.exists()
    assert cli.main(["check", "RenderFake-v0", "--no-frame"]) == 0
    assert "first frame" not in capsys.readouterr().out


def test_check_command_without_render_or_imageio(registered, tmp_path, monkeypatch, capsys):
    from jaxsampler import cli

    assert cli.main(["check", "Fake-v0", "--frame", str(tmp_path / "f.png")]) == 0
    assert "first frame" not in capsys.readouterr().out and not (tmp_path / "f.png").exists()
    bad = tmp_path / "missing" / "f.png"
    with pytest.raises(SystemExit) as exited:  # a one-line usage error, before any check
        cli.main(["check", "RenderFake-v0", "--frame", str(bad)])
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert str(bad) in captured.err and "check_env" not in captured.out  # failed first
    monkeypatch.setitem(sys.modules, "imageio", None)
    assert cli.main(["check", "RenderFake-v0", "--frame", str(tmp_path / "g.png")]) == 0
    out = capsys.readouterr().out
    assert (
        'first frame: not written (8x6): PNG files need imageio: pip install -e ".[video]"' in out
    )


def test_check_env_checks_render():
    @dataclasses.dataclass(frozen=True)
    class BadRender(RenderFake):
        def render(self, state: Any, params: Any = None) -> jax.Array:
            return super().render(state, params).astype(jnp.float32)

    good = js.check_env(RenderFake(), num_envs=2)
    assert good.ok and "render" in good.checks_run
    report = js.check_env(BadRender(), num_envs=2)
    assert any(
        "render must return uint8[H, W, 3], got float32[6, 8, 3]" in p for p in report.problems
    )


# --------------------------------------------------------------------------- transforms, explore


@struct.dataclass
class WalkState:
    pos: jax.Array
    time: jax.Array


@struct.dataclass
class WalkParams:
    offset: float = 1.0
    max_steps_in_episode: int = 3


@dataclasses.dataclass(frozen=True)
class WalkEnv(SingleAgentEnv):
    """A walker on a line: action 1 steps right, 0 left; obs = [pos + offset]; the frame
    has a red column at ``pos + 4``."""

    @property
    def default_params(self) -> WalkParams:
        return WalkParams()

    @property
    def observation_space(self) -> Box:
        return Box(-np.inf, np.inf, (1,), np.float32)

    @property
    def action_space(self) -> Discrete:
        return Discrete(2)

    def reset_env(self, key, params):
        state = WalkState(jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))
        return self._obs(state, params), state

    def step_env(self, key, state, action, params):
        state = state.replace(pos=state.pos + jnp.where(action == 1, 1, -1))
        return self._obs(state, params), state, jnp.float32(0), jnp.bool_(False), NoInfo()

    @staticmethod
    def _obs(state, params):
        return jnp.reshape(state.pos + params.offset, (1,)).astype(jnp.float32)

    def render(self, state: Any, params: Any = None) -> jax.Array:
        return jnp.zeros((H, W, 3), jnp.uint8).at[:, (state.pos + 4) % W, 0].set(255)

    @property
    def can_render(self) -> bool:
        return True


@dataclasses.dataclass(frozen=True)
class SignPolicy(Policy):
    """Greedy: right while the observation is positive; exploring: a coin flip."""

    observation_space: Box
    action_space: Discrete
    explore: bool = True

    def init(self, key):
        return ()

    def __call__(self, params, obs, key, state):
        greedy_action = (obs[..., 0] > 0).astype(jnp.int32)
        coin = jax.random.bernoulli(key, 0.5, greedy_action.shape).astype(jnp.int32)
        return (coin if self.explore else greedy_action), {}, state


def red_columns(frames: np.ndarray) -> list[int]:
    return [int(np.argmax(f[0, :, 0])) for f in frames]


def test_transforms_normalize_what_the_policy_sees_and_explore_switch():
    from jaxsampler.transforms import NormalizeObservation

    env, tf = WalkEnv(), (NormalizeObservation(),)
    policy = SignPolicy(env.observation_space, env.action_space)
    # Greedy (explore=False, the default): obs = pos + 1 > 0, so it walks right.
    frames, lengths = video.rollout_frames(env, policy, (), KEY, 2)
    assert np.asarray(lengths).tolist() == [3, 3]
    assert red_columns(np.asarray(frames[0])) == [4, 5, 6, 7]
    # Statistics of training at offset 10: normalized, pos + 1 is far below the mean, so
    # the same greedy policy walks left.
    rollout = js.make_rollout(env, policy, 2, 8, transforms=tf)
    state, _ = jax.jit(rollout)((), rollout.init(KEY, WalkParams(offset=10.0)))
    assert float(state.transform_state.stages[0].shared[0].mean[0]) > 5
    frames, _ = video.rollout_frames(env, policy, (), KEY, 2, transforms=tf, transform_state=state)
    for i in range(2):
        assert red_columns(np.asarray(frames[i])) == [4, 3, 2, 1]
    # Exploring: coin flips, one step at a time, with the documented policy keys.
    frames, _ = video.rollout_frames(env, policy, (), KEY, 1, explore=True)
    k_pol = jax.random.split(KEY, 4)[2]
    coins = [
        int(jax.random.bernoulli(jax.random.fold_in(k_pol, t), 0.5, (1, 1))[0, 0]) for t in range(3)
    ]
    assert red_columns(np.asarray(frames[0])) == list(
        4 + np.cumsum([0] + [2 * c - 1 for c in coins])
    )


# --------------------------------------------------------------------------- built-in envs


def test_cartpole_by_env_id_matches_hand_stepping_and_evaluate():
    from jaxsampler.envs.cartpole import CartPole

    env = CartPole()
    if not getattr(env, "can_render", False):
        pytest.skip("the built-in CartPole has no renderer in this checkout")
    policy = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(4,))
    params = policy.init(jax.random.PRNGKey(5))
    key = jax.random.PRNGKey(0)  # record_video's seed=0
    out = js.integrations.record_video("CartPole-v1", policy, params, None, 2, max_steps=12)
    ref = by_hand(env, js.policies.greedy(policy), key, 2, 12, params)
    np.testing.assert_array_equal(out, np.concatenate(ref))
    lengths = js.evaluate(env, policy, params, 2, key, max_steps=12).lengths
    assert [len(r) - 1 for r in ref] == lengths.tolist()
    assert out.shape[1:] == (*env.render_shape, 3)
