"""``DeviceSampler``: the :class:`~jaxsampler.sampling.base.Sampler` of pure-JAX envs, which
runs whole jitted rollout chunks on the device and converts them on the host in bulk, so
no Python loop ever runs over timesteps."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Protocol

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxsampler.constants import DEFAULT_POLICY_ID
from jaxsampler.envs.base import Env
from jaxsampler.episodes.batch import MultiAgentBatch
from jaxsampler.episodes.ids import EpisodeIds
from jaxsampler.host_envs.adapt import is_host_stepped
from jaxsampler.policies.base import Policy
from jaxsampler.rollout import distributed, placement
from jaxsampler.rollout.scan import (
    Transforms,
    check_compatible,
    init_state_and_info,
    jit_rollout,
    make_rollout,
)
from jaxsampler.sampling.base import Sampler
from jaxsampler.sampling.device import grouped, setup
from jaxsampler.sampling.device.columns import InfoPath, info_leaves, with_transform_infos
from jaxsampler.sampling.device.multi import MultiAgentConverter
from jaxsampler.sampling.device.overlap import (
    WEIGHTS_SEQ_NO,
    BufferRing,
    Prefetched,
    WeightsVersion,
    chunk_counts,
    copy_state,
    tag_chunk,
)
from jaxsampler.sampling.device.parallel import HostPool, host_pool, shards_to_host, using_pool
from jaxsampler.sampling.device.single import EpisodeFactory, SingleAgentConverter
from jaxsampler.sampling.metrics import (
    SamplerMetrics,
    check_lookback,
    explain_policy_mismatch,
    exploring_or_greedy,
)
from jaxsampler.transforms.base import TransformState
from jaxsampler.types import Trajectory

__all__ = ["Converter", "DeviceSampler"]


class _Call(NamedTuple):
    """One call's host copies of its rollout chunks, and what their conversion needs."""

    chunks: list[Trajectory]
    #: for a ``num_episodes`` call counted over several processes, the step at which the
    #: count was reached (``None``: the converter finds it)
    cutoff: int | None
    num_episodes: int | None


class Converter(Protocol):
    """Turns the host copies of one call's rollout chunks into episodes or a batch, and
    carries what running episodes need into the next call."""

    def reset(self, reset_info: dict[InfoPath, np.ndarray]) -> None:
        """Forgets the running episodes; new ones start with these reset infos."""

    def episodes(
        self,
        chunks: list[Trajectory],
        num_episodes: int | None,
        state: Any,
        cutoff: int | None = None,
    ) -> tuple[list[Any], SamplerMetrics]:
        """The call's episodes and its metrics (``cutoff``: see ``_Call``)."""

    def batch(
        self,
        chunks: list[Trajectory],
        num_episodes: int | None,
        state: Any,
        cutoff: int | None = None,
    ) -> tuple[MultiAgentBatch, SamplerMetrics]:
        """The call's batch and its metrics."""

    def get_state(self) -> dict[str, Any]:
        """What the running episodes carry, for a checkpoint."""

    def set_state(self, state: dict[str, Any]) -> None:
        """Installs what :meth:`get_state` returned."""


class DeviceSampler(Sampler):
    """The :class:`~jaxsampler.sampling.base.Sampler` of a pure-JAX env: each call runs
    whole jitted rollout chunks and converts them in bulk on the host.

    ``DeviceSampler.sample(params)`` runs whole ``rollout_length`` device chunks and turns
    them into numpy'ized :class:`SingleAgentEpisode` objects, following RLlib's
    ``SingleAgentEnvRunner.sample()``, adapted to a device that runs whole chunks:

    * jaxsampler's next-step auto-reset *is* Gymnasium's NEXT_STEP mode: reset steps
      deliver the new episode's first observation and are not counted as timesteps;
    * ``num_timesteps=N``: as many rollout calls as needed until at least ``N`` (non-reset)
      env steps were taken; every step sampled is returned exactly once (nothing dropped);
    * ``num_episodes=N``: all envs are reset first (ongoing episodes are discarded, as in
      RLlib), then calls run until ``N`` episodes have finished; the episodes that finished
      up to the step at which the count reached ``N`` are returned, and the next call resets
      again;
    * neither: one rollout call;
    * ``topup_length=L``: a ``num_timesteps`` / ``num_episodes`` call runs one
      ``rollout_length`` chunk, then ``L``-step chunks until the count is reached, so the
      count is overshot by one short chunk at most (reset steps do not count, so one full
      chunk of ``num_timesteps = num_envs * rollout_length`` is usually a little short);
    * ongoing episodes are returned as chunks (``t > 0``) and continue in the next call with
      the same ``id_``, ``t_started`` = the previous chunk's ``t`` and a lookback of up to
      ``episode_lookback_horizon`` steps taken from the previous chunk.

    Conversion is a converter object picked once at construction
    (:class:`~jaxsampler.sampling.device.single.SingleAgentConverter` or
    :class:`~jaxsampler.sampling.device.multi.MultiAgentConverter`; a single-agent sampler
    may be given an ``episode_factory`` that builds other episode objects, e.g. RLlib's,
    straight from the call's columns): one bulk device-to-host copy per call, one bulk
    transpose to env-major columns (with the lookback steps prepended), episode boundaries
    from the ``is_reset`` flags with ``np.nonzero``. The only Python loop is over episodes,
    never over timesteps.

    Transforms (``transforms=``) run inside the rollout: episodes and batches hold what the
    policy saw (transformed observations and rewards, policy-side actions) and
    :class:`SamplerMetrics` the env's own returns (sums of ``Trajectory.raw_rewards``). The
    env's raw observations and rewards are not copied into infos (that costs about a fifth
    of the conversion of a ``sample()`` call and more when every episode's infos are read);
    they are in :attr:`DeviceSampler.last_chunks` (``raw_obs`` / ``raw_rewards``). Under
    domain randomization each step's infos carry the env params it ran with
    (``infos["env_params"]``). A reset continues the transforms' statistics.

    Devices (``devices=`` / ``mesh=``): the rollouts are built with ``make_rollout(...,
    mesh=)`` (the env axis split over the mesh's ``"env"`` axis, the random streams those of
    one device), the reset state is computed by one jitted call laid out on the mesh, and
    the host copy reads this process's shards (:func:`jaxsampler.rollout.placement.to_host`,
    still one transfer per call); the converters hold this process's envs only. On a mesh
    spanning processes the ``num_timesteps`` / ``num_episodes`` counts are global (one small
    allgather of step and episode counts per chunk), so every process makes the same rollout
    calls.

    Args:
        env: a jaxsampler env or a registered env id (``js.make``).
        policy: the policy (``(params, obs, key, state) -> (action, extras, state)``).
        num_envs: envs stepped side by side (the env axis; ``None``: 1).
        rollout_length: device steps per rollout call.
        seed: PRNG seed; the same seed and calls give identical episodes.
        env_params: env params (default ``env.default_params``).
        episode_lookback_horizon: lookback steps carried into continuation chunks.
        rllib_compatible: multi-agent envs: agents' done flags exactly as RLlib 2.60's
            ``MultiAgentEpisode.add_env_step`` sets them (every agent stepped in an
            episode's last step is terminated, and truncated too if the episode is).
            Default ``False``: each agent keeps the env's own flags.
        topup_length: after a call's first ``rollout_length`` chunk, further chunks of
            the call are this many steps long (a second jitted rollout, compiled on the
            first call that needs it); ``None``: every chunk is ``rollout_length`` long.
        episode_factory: single-agent envs: builds ``sample()``'s episodes from the
            call's :class:`~jaxsampler.sampling.device.single.EpisodeColumns` instead
            of jaxsampler's :class:`SingleAgentEpisode` (``sample_batch()`` is
            unaffected); ``None``: jaxsampler's episodes.
        transforms: env->policy / policy->env transforms run inside the rollout
            (:mod:`jaxsampler.transforms`, env side first, or a bound
            :class:`~jaxsampler.transforms.Pipeline`); the policy must be built for
            ``js.rollout.pipeline_of(env, transforms).observation_space`` / ``.action_space``.
            Episodes and batches hold what the policy saw (transformed observations and
            rewards, policy-side actions); :attr:`metrics` report the env's own returns
            (raw rewards). Under domain randomization each step's infos carry the env
            params it ran with (``infos["env_params"]``, a nested dict of the params'
            fields).
        explore: ``False``: the policy acts greedily (:func:`jaxsampler.policies.greedy.greedy`:
            argmax / mean); a policy without an explore switch raises ``TypeError``.
        devices: split the env axis over this many devices (the first ``n`` of
            ``jax.devices()``) or over these devices: the rollouts run on a 1-D mesh
            named ``"env"`` (:func:`jaxsampler.rollout.placement.env_mesh`), each device
            stepping ``num_envs / n`` envs. ``None``: one device, as without a mesh.
        mesh: the same with a :class:`~jax.sharding.Mesh` of your own (it must have an
            ``"env"`` axis; other axes replicate). It may span processes (after
            :func:`jaxsampler.rollout.distributed.initialize`, e.g. ``placement.env_mesh()``
            over ``jax.devices()``): every process then builds the same sampler (same
            arguments, same seed) and makes the same calls with the same params, and
            gets only its own envs (global indices :attr:`local_envs`): their episodes,
            their batch rows, their :attr:`metrics` (:meth:`global_metrics` combines
            the processes'). ``num_envs`` is the global count; so are
            ``num_timesteps`` / ``num_episodes``: a call runs until all processes' envs
            together reach the count, so every process makes the same rollout calls
            and the processes' results together are what one process holding every
            env would return (up to the float rounding below). Episode ids are those
            one process would give (unique across processes, deterministic per seed).
            Pass ``devices`` or ``mesh``, not both.
        reset_pool: cheap randomized auto-resets
            (:class:`~jaxsampler.vector.ResetPool` or a pool size; ``reset_pool=`` of
            :func:`~jaxsampler.rollout.make_rollout`). ``None``: every reset exact.

            What is identical across device (and process) counts for the same seed
            and calls: every random draw (each env's reset and step keys and the
            policy's keys are the unsharded rollout's), hence the discrete actions, the
            episode boundaries, ids, lengths, ``t``, the done flags, integer infos, and
            the number of rollout calls. Float observations, rewards, float infos and
            the policy's float extras (logp, value predictions) may differ by float
            rounding (XLA compiles a slice of the env axis to slightly different
            instructions than the whole; measured up to about 1e-6 absolute after
            a normalizer, growing along chaotic dynamics), and so may a continuous
            action; a discrete action would differ only where rounding crosses a
            sampling boundary (not seen in tests).
            Transform statistics (normalizers) are global: reductions over envs are
            collectives, summed in a different order than on one device.

        callbacks: objects with ``on_sample_end(report)``
            (:class:`~jaxsampler.sampling.callbacks.SamplerCallback`, e.g. the loggers of
            :mod:`jaxsampler.integrations.loggers`), called after every ``sample()`` /
            ``sample_batch()`` with a :class:`~jaxsampler.sampling.callbacks.SampleReport`.
        overlap: a call of several chunks (``num_timesteps`` / ``num_episodes``,
            ``topup_length``) dispatches chunk ``k + 1`` before it copies chunk ``k`` to
            the host (the counts that decide whether ``k + 1`` is needed are read on the
            device; two buffer sets take turns, as the rollout donates them). Results are
            bit-identical either way; ``False``: each chunk is copied before the next runs.
        prefetch: at the end of a ``num_timesteps`` or plain call, dispatch the next
            call's first ``rollout_length`` chunk with this call's params before this
            call's data is converted, so the next call finds it (partly) done. Its
            samples then come from the previous call's params: every step is tagged
            with the weights version that produced it, an ``int64`` extra
            ``"weights_seq_no"`` (RLlib's name) in every episode's extra model outputs
            and every batch row (see :attr:`weights_seq_no`; ``sample(...,
            weights_seq_no=n)`` names the version). Not after a ``num_episodes`` call
            (the next call resets); a call that resets (``num_episodes``,
            ``force_reset``), :meth:`reset`, :meth:`save`, :meth:`load` and :meth:`close`
            discard the prefetched chunk and return to the state before it
            (:meth:`discard_prefetch`), so a checkpoint never holds a rollout in flight.
            A checkpoint of a prefetching sampler loads only into a prefetching one.
        host_threads: threads that copy device shards to the host and split the
            conversion by env or row ranges (``None``: one per local CPU device, 8 or one per
            device on GPU / TPU, at most one per core: ``setup.default_host_threads``).

    Checkpoints: :meth:`save` / :meth:`load` / :meth:`Sampler.restore` capture the
    random state, the env and policy states, episode counters and ids, the transforms'
    statistics, per-env params, the open episode chunks with their lookback, and the
    metrics and totals: a restored sampler's next calls equal, bit for bit, those the
    saving sampler would have made next (also on a mesh of devices in one process; a
    mesh spanning processes cannot be checkpointed yet).

    Attributes:
        last_split: ``(rollout_s, to_episodes_s)`` of the last ``sample()`` /
            ``sample_batch()`` call: wall time of the rollout calls (device and host
            copy), and of the conversion into episodes or a batch.
        last_chunks: the host copies (numpy leaves) of the last call's rollout chunks,
            :class:`~jaxsampler.types.Trajectory` objects ``[T, E, A, ...]``: with
            transforms, ``raw_obs`` / ``raw_rewards`` hold the env's own observations and
            rewards behind the episodes' (transformed) ones, for debugging; kept until
            the next call (no copy is made for it).
        pipeline: the transforms bound to the env's spaces (empty without transforms).
        mesh: the mesh the env axis is split over (``None``: one device, no mesh).
        local_envs: the global env indices this process holds and returns (all of them
            unless the mesh spans processes); episodes' env streams and batch rows are
            those envs, in order.
    """

    def __init__(
        self,
        env: Env | str,
        policy: Policy,
        num_envs: int | None = 1,
        rollout_length: int = 128,
        seed: int = 0,
        *,
        env_params: Any = None,
        episode_lookback_horizon: int = 1,
        rllib_compatible: bool = False,
        topup_length: int | None = None,
        episode_factory: EpisodeFactory | None = None,
        transforms: Transforms = None,
        explore: bool = True,
        devices: int | list[jax.Device] | tuple[jax.Device, ...] | None = None,
        mesh: Mesh | None = None,
        reset_pool: Any = None,
        callbacks: Any = None,
        overlap: bool = True,
        prefetch: bool = False,
        host_threads: int | None = None,
    ):
        env = setup.resolve_env(env)
        num_envs = 1 if num_envs is None else num_envs
        self._init_reporting(callbacks)
        self.mesh = setup.sampler_mesh(devices, mesh)
        policy = exploring_or_greedy(policy, explore)
        if topup_length is not None and (
            isinstance(topup_length, bool) or not isinstance(topup_length, int) or topup_length < 1
        ):
            raise ValueError(f"topup_length must be an int >= 1 or None, got {topup_length!r}")
        if episode_factory is not None and env.num_agents != 1:
            raise ValueError(
                f"episode_factory is for single-agent envs; {env.name} has {env.num_agents} "
                "agents (its episodes are MultiAgentEpisode objects): drop episode_factory"
            )
        episode_lookback_horizon = check_lookback(episode_lookback_horizon)
        self.env, self.policy = env, policy
        self.num_envs, self.rollout_length = num_envs, rollout_length
        self.env_params = env.default_params if env_params is None else env_params
        self.horizon = episode_lookback_horizon
        try:
            pipe = check_compatible(env, policy, transforms)
        except ValueError as exc:
            raise explain_policy_mismatch(exc, transforms) from None
        #: the transforms bound to the env's spaces (empty without transforms)
        self.pipeline = pipe
        self.explore = explore
        self.rllib_compatible = bool(rllib_compatible)
        self._rollout = jit_rollout(
            make_rollout(
                env,
                policy,
                num_envs,
                rollout_length,
                transforms=pipe,
                mesh=self.mesh,
                reset_pool=reset_pool,
            )
        )
        self.reset_pool = reset_pool
        self.local_envs = slice(0, num_envs)
        self._spans_processes = False
        if self.mesh is not None:
            self.local_envs = placement.local_env_slice(self.mesh, num_envs)
            self._spans_processes = any(
                d.process_index != jax.process_index() for d in self.mesh.devices.flat
            )
            if self.local_envs.stop == self.local_envs.start:
                raise ValueError(
                    f"process {jax.process_index()} holds none of the mesh's devices; build "
                    "the mesh over every process's devices "
                    "(jaxsampler.rollout.placement.env_mesh())"
                )
        self._init_jit: Any = None  # built on the first reset on a mesh
        local = self.local_envs.stop - self.local_envs.start
        self.topup_length = topup_length
        self._topup: Any = None  # built on first use
        self.overlap, self.prefetch = bool(overlap), bool(prefetch)
        depth = 2 if self.overlap or self.prefetch else 1
        self._rings = {False: BufferRing(depth), True: BufferRing(depth)}  # by "topup"
        self._prefetched: Prefetched | None = None
        self._versions = WeightsVersion()
        self._given_version: int | None = None
        if host_threads is None:
            host_threads = setup.default_host_threads(self.mesh)
        self._pool: HostPool = host_pool(host_threads)
        self.last_chunks: list[Trajectory] = []
        self._key = jax.random.PRNGKey(seed)
        # (env, count) -> id, deterministic per seed; local env i is global env offset + i
        self._episode_id = EpisodeIds(seed, stream_offset=self.local_envs.start)
        self._state: Any = None
        self._carried: TransformState | None = None  # transform state across fresh starts
        self.metrics = SamplerMetrics()
        self.agent_ids = tuple(env.agent_ids)
        self.agent_policy = tuple(
            getattr(policy, "agent_policy", None) or (DEFAULT_POLICY_ID,) * env.num_agents
        )
        self._convert: Converter
        if env.num_agents == 1:
            self._convert = SingleAgentConverter(
                self._episode_id,
                local,
                pipe.observation_space,
                pipe.action_space,
                episode_lookback_horizon,
                policy_id=self.agent_policy[0],
                episode_factory=episode_factory,
            )
        else:
            self._convert = MultiAgentConverter(
                self._episode_id,
                local,
                self.agent_ids,
                self.agent_policy,
                pipe.observation_space,
                pipe.action_space,
                episode_lookback_horizon,
                rllib_compatible=rllib_compatible,
                grouped=grouped.grouped_output(env, policy, self.agent_ids, self.agent_policy),
            )

    @property
    def last_split(self) -> tuple[float, float]:
        """``(rollout_s, to_episodes_s)`` of the last ``sample()`` / ``sample_batch()``."""
        return self._last_split

    @classmethod
    def accepts(cls, env: Any) -> bool:
        """A pure-JAX env or an env id: every env that is not host-stepped
        (:func:`jaxsampler.host_envs.is_host_stepped`); an object that is neither fails in
        the env's resolution here, with its own message."""
        return not is_host_stepped(env)

    # ------------------------------------------------------------------------- state

    @property
    def transform_state(self) -> TransformState | None:
        """The transforms' current state (``shared`` statistics, per-env ``rows``), as the
        rollout carries it; ``None`` without transforms or before the first call."""
        return self._carried if self._state is None else self._state.transform_state

    def reset(self) -> None:
        """Resets every env; ongoing episodes are discarded. The transforms' ``shared``
        state (e.g. normalization statistics) continues; their per-env rows restart. A
        prefetched chunk is discarded first (:meth:`discard_prefetch`)."""
        self.discard_prefetch()
        self._key, k = jax.random.split(self._key)
        old = self.transform_state
        if self.mesh is None:
            self._state, info = init_state_and_info(
                self.env, self.policy, self.num_envs, k, self.env_params, self.pipeline, old
            )
        else:
            self._state, info = self._init_on_mesh(k, old)
            info = placement.to_host(info)  # this process's envs
        self._episode_id.new_run()
        info = self._reset_infos(info)
        self._convert.reset({path: np.asarray(leaf) for path, leaf in info_leaves(info)})

    def _reset_infos(self, info: Any) -> Any:
        """The reset observations' info, with the env params of the first episodes under
        domain randomization (as each step's infos carry them)."""
        if not self.pipeline.randomizes_params:
            return info
        return with_transform_infos(info, env_params=placement.to_host(self._state.env_params))

    def _init_on_mesh(self, key: jax.Array, transform_state: Any) -> tuple[Any, Any]:
        """``init_state_and_info`` as one jitted call whose outputs are laid out on the
        mesh (the state as the rollout places it, the info split over envs): every
        process runs it with the same key."""
        if self._init_jit is None:
            assert self.mesh is not None
            mesh, env, policy, pipe, E = (
                self.mesh,
                self.env,
                self.policy,
                self.pipeline,
                self.num_envs,
            )
            # Array leaves of the params are arguments; Python numbers stay constants.
            leaves, treedef = jax.tree.flatten(self.env_params)
            arrays = [x for x in leaves if _is_array(x)]

            def init(k: jax.Array, arr: list[Any], ts: Any) -> tuple[Any, Any]:
                it = iter(arr)
                params = jax.tree.unflatten(
                    treedef, [next(it) if _is_array(x) else x for x in leaves]
                )
                return init_state_and_info(env, policy, E, k, params, pipe, ts)

            state, info = jax.eval_shape(init, key, arrays, None)
            shardings = (
                placement.state_sharding(env, state, mesh),
                jax.tree.map(
                    lambda x: NamedSharding(
                        mesh, P(placement.AXIS) if x.ndim and x.shape[0] == E else P()
                    ),
                    info,
                ),
            )
            jitted = jax.jit(init, out_shardings=shardings)
            self._init_jit = lambda k, ts: jitted(k, arrays, ts)
        out: tuple[Any, Any] = self._init_jit(key, transform_state)
        return out

    def _host_copy(self, traj: Trajectory) -> Trajectory:
        # One transfer per call; on a mesh spanning processes, this process's envs; on a
        # mesh of this process's devices, shard by shard over the host threads.
        if self.mesh is None or self._spans_processes:
            host = placement.to_host(traj)
        else:
            host = shards_to_host(traj, self._pool)
        if host.env_params is None:
            return host
        # Under domain randomization each step's infos carry its params (the info at
        # slot t came with step t, so with the observation its params produced).
        return dataclasses.replace(
            host, infos=with_transform_infos(host.infos, env_params=host.env_params)
        )

    def _dispatch(self, params: Any, topup: bool) -> Trajectory:
        """Starts one rollout chunk (asynchronously) and advances the state; ``topup``:
        a ``topup_length`` chunk. Returns its device trajectory."""
        ring = self._rings[topup]
        if not topup:
            run = self._rollout
        else:
            if self._topup is None:
                assert self.topup_length is not None
                self._topup = jit_rollout(
                    make_rollout(
                        self.env,
                        self.policy,
                        self.num_envs,
                        self.topup_length,
                        transforms=self.pipeline,
                        mesh=self.mesh,
                        reset_pool=self.reset_pool,
                    )
                )
            run = self._topup
        self._state, traj = run(params, self._state, ring.take())
        ring.put(traj)
        return traj

    def _fetch(self, traj: Trajectory, version: int) -> Trajectory:
        """The host copy of a dispatched chunk (waits for it), tagged with the weights
        version that produced it when the sampler prefetches."""
        host = self._host_copy(traj)
        return tag_chunk(host, version) if self.prefetch else host

    # ------------------------------------------------------------------------- sampling

    def sample(
        self,
        params: Any,
        num_timesteps: int | None = None,
        num_episodes: int | None = None,
        force_reset: bool = False,
        *,
        weights_seq_no: int | None = None,
    ) -> list[Any]:
        """:meth:`Sampler.sample`; ``weights_seq_no``: the version of ``params`` (an
        int >= 0) that a prefetching sampler tags its steps with (``None``: counted, see
        :attr:`weights_seq_no`)."""
        self._given_version = weights_seq_no
        return super().sample(params, num_timesteps, num_episodes, force_reset)

    def sample_batch(
        self,
        params: Any,
        num_timesteps: int | None = None,
        num_episodes: int | None = None,
        force_reset: bool = False,
        *,
        weights_seq_no: int | None = None,
    ) -> MultiAgentBatch:
        """:meth:`Sampler.sample_batch`; ``weights_seq_no``: as in :meth:`sample`."""
        self._given_version = weights_seq_no
        return super().sample_batch(params, num_timesteps, num_episodes, force_reset)

    @property
    def weights_seq_no(self) -> int:
        """The weights version of the last call's params: the ``weights_seq_no=`` given
        to that call, else a counter that starts at 0 and moves on by one whenever a call
        gets params that are not the previous call's objects (leaf by leaf)."""
        return self._versions.current

    def _collect(
        self,
        params: Any,
        num_timesteps: int | None,
        num_episodes: int | None,
        force_reset: bool,
    ) -> _Call:
        """The call loop: rollout chunks until the requested counts are reached. With
        ``overlap`` the next chunk is dispatched before this one is copied to the host
        (the counts that decide it are read on the device); with ``prefetch`` the next
        call's first chunk is dispatched before this call's last one is copied."""
        given, self._given_version = self._given_version, None
        version = self._versions.update(params, given)
        if self._state is None or force_reset or num_episodes is not None:
            self.reset()  # (discards a prefetched chunk first)
        chunks: list[Trajectory] = []
        self.last_chunks = chunks
        pending = self._take_prefetched()
        if pending is None:
            pending = (self._dispatch(params, topup=False), version)
        if self._spans_processes and (num_timesteps is not None or num_episodes is not None):
            cutoff = self._run_global(params, version, chunks, pending, num_timesteps, num_episodes)
            return _Call(chunks, cutoff, num_episodes)
        topup = self.topup_length not in (None, self.rollout_length)
        counted = num_timesteps is not None or num_episodes is not None
        steps = done = 0
        while True:
            traj, ver = pending
            if counted and self.overlap:
                n_steps, n_done = chunk_counts(traj)
            else:
                host = self._fetch(traj, ver)
                n_steps, n_done = int(np.count_nonzero(~host.is_reset)), _count_done(host)
            steps, done = steps + n_steps, done + n_done
            if num_episodes is not None:
                more = done < num_episodes
            else:
                more = num_timesteps is not None and steps < num_timesteps
            if more:
                pending = (self._dispatch(params, topup=topup), version)
            elif self.prefetch and num_episodes is None:
                self._prefetch(params, version)
            if counted and self.overlap:
                host = self._fetch(traj, ver)
            chunks.append(host)
            if not more:
                return _Call(chunks, None, num_episodes)

    def _prefetch(self, params: Any, version: int) -> None:
        """Dispatches the next call's first chunk with these params (the state before it
        is kept, to go back to if the chunk is discarded)."""
        before = copy_state(self._state)
        traj = self._dispatch(params, topup=False)
        self._prefetched = Prefetched(traj, before, version)

    def _take_prefetched(self) -> tuple[Trajectory, int] | None:
        """The prefetched chunk and its version, now part of this call (``None``: none)."""
        pf, self._prefetched = self._prefetched, None
        return None if pf is None else (pf.traj, pf.version)

    def discard_prefetch(self) -> bool:
        """Discards the chunk dispatched ahead for the next call, if any: the sampler
        returns to the state before it, so its next call runs as a sampler without
        ``prefetch`` would (with that call's params). ``reset()``, ``save()``, ``load()``,
        ``close()`` and calls that reset (``num_episodes``, ``force_reset``) do this
        first. Returns whether a chunk was discarded."""
        pf, self._prefetched = self._prefetched, None
        if pf is None:
            return False
        self._state = pf.state_before
        return True

    def close(self) -> None:
        """Discards a prefetched chunk (:meth:`discard_prefetch`); nothing else to release."""
        self.discard_prefetch()

    def _end_state(self) -> Any:
        """The rollout state at the call's end (a prefetched chunk's starting state)."""
        return self._state if self._prefetched is None else self._prefetched.state_before

    def _episodes(self, call: _Call) -> list[Any]:
        """The call's episodes (:class:`SingleAgentEpisode` or :class:`MultiAgentEpisode`
        chunks, or the ``episode_factory``'s)."""
        with using_pool(self._pool):
            out, metrics = self._convert.episodes(
                call.chunks, call.num_episodes, self._end_state(), call.cutoff
            )
        return self._finish(out, metrics, call)

    def _batch(self, call: _Call) -> MultiAgentBatch:
        """The call's batch (built straight from the host copies of the buffers; ``new_obs``
        derived from the single observation track)."""
        with using_pool(self._pool):
            out, metrics = self._convert.batch(
                call.chunks, call.num_episodes, self._end_state(), call.cutoff
            )
        return self._finish(out, metrics, call)

    def _run_global(
        self,
        params: Any,
        version: int,
        chunks: list[Trajectory],
        first: tuple[Trajectory, int],
        num_timesteps: int | None,
        num_episodes: int | None,
    ) -> int | None:
        """The call loop of a mesh spanning processes: the counts are every process's
        envs' together (one small allgather per chunk), so all processes stop after the
        same chunk. Returns the step of the call at which the ``num_episodes``-th episode
        ended (``None`` for ``num_timesteps``)."""
        steps = done = offset = 0
        topup = self.topup_length not in (None, self.rollout_length)
        pending: tuple[Trajectory, int] | None = first
        while True:
            if pending is None:
                pending = (self._dispatch(params, topup=topup), version)
            traj = self._fetch(*pending)
            pending = None
            chunks.append(traj)
            live = ~np.asarray(traj.is_reset)
            ended = np.count_nonzero(
                np.all(traj.terminated | traj.truncated, axis=-1) & live, axis=1
            )  # per step, this process's envs
            local = np.concatenate([[np.count_nonzero(live)], ended]).astype(np.int32)
            total = distributed.process_sum(local).astype(np.int64)
            steps += int(total[0])
            if num_episodes is not None:
                need = num_episodes - done
                done += int(total[1:].sum())
                if done >= num_episodes:
                    return offset + int(np.searchsorted(np.cumsum(total[1:]), need))
            elif num_timesteps is not None and steps >= num_timesteps:
                return None
            offset += live.shape[0]

    def _finish(self, out: Any, metrics: SamplerMetrics, call: _Call) -> Any:
        metrics.num_rollout_calls = len(call.chunks)
        self.metrics = metrics
        if call.num_episodes is not None:
            # The next call starts fresh, as RLlib does (the transforms' statistics go on).
            self._carried = self._state.transform_state
            self._state = None
        return out

    # ------------------------------------------------------------------------- checkpoints

    def _no_multiprocess_checkpoints(self) -> None:
        if self._spans_processes:
            raise NotImplementedError(
                "a sampler on a mesh that spans processes cannot be checkpointed yet (each "
                "process holds its own open episodes); checkpoint the pure rollout state "
                "with jaxsampler.rollout.checkpoint.save instead"
            )

    def _checkpoint_fingerprint(self) -> dict[str, Any]:
        pipe = self.pipeline
        return {
            "sampler": type(self).__name__,
            "env": self.env.name,
            "num_envs": self.num_envs,
            "agent_ids": [str(a) for a in self.agent_ids],
            "rollout_length": self.rollout_length,
            "topup_length": self.topup_length,
            "observation_space": repr(pipe.observation_space),
            "action_space": repr(pipe.action_space),
            "transforms": [setup.stable_repr(t) for t in pipe.transforms],
            "policy": type(self.policy).__name__,
            "explore": self.explore,
            "episode_lookback_horizon": self.horizon,
            "rllib_compatible": self.rllib_compatible,
            "reset_pool": setup.stable_repr(self.reset_pool),
            "local_envs": [self.local_envs.start, self.local_envs.stop],
            **({"tags": [WEIGHTS_SEQ_NO]} if self.prefetch else {}),
        }

    def _checkpoint_parts(self) -> tuple[dict[str, Any], Any, dict[str, Any]]:
        self._no_multiprocess_checkpoints()
        self.discard_prefetch()  # a checkpoint holds no rollout in flight
        arrays: dict[str, Any] = {"key": self._key}
        if self._state is not None:
            arrays["state"] = self._state
        elif self._carried is not None:
            arrays["carried"] = self._carried
        host = {
            # the ids' run prefix comes from the seed: the restoring sampler's may differ
            "ids": self._episode_id.get_state(),
            "converter": self._convert.get_state(),
            "metrics": self.metrics,
            "totals": self.totals,
            "weights_seq_no": self._versions.current,
        }
        return arrays, host, self._checkpoint_fingerprint()

    def _checkpoint_refs(self) -> dict[str, Any]:
        return {
            "ids": self._episode_id,
            "observation_space": self.pipeline.observation_space,
            "action_space": self.pipeline.action_space,
        }

    def _checkpoint_like(self, parts: list[str]) -> Any:
        self._no_multiprocess_checkpoints()
        state = jax.eval_shape(
            lambda k: init_state_and_info(
                self.env, self.policy, self.num_envs, k, self.env_params, self.pipeline, None
            )[0],
            self._key,
        )
        if self.mesh is not None:
            shardings = placement.state_sharding(self.env, state, self.mesh)
            state = jax.tree.map(
                lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
                state,
                shardings,
            )
        like: dict[str, Any] = {"key": self._key}
        if "state" in parts:
            like["state"] = state
        if "carried" in parts:
            like["carried"] = state.transform_state
        return like

    def _apply_checkpoint(self, arrays: Any, host: Any) -> None:
        self._key = arrays["key"]
        self._state = arrays.get("state")
        self._carried = arrays.get("carried")
        self._prefetched = None
        self._versions.restart(host.get("weights_seq_no", 0))
        for ring in self._rings.values():
            ring.clear()
        self._episode_id.set_state(host["ids"])
        self._convert.set_state(host["converter"])
        self.metrics = host["metrics"]
        self.totals = host["totals"]
        self.last_chunks = []


def _is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray))


def _count_done(traj: Trajectory) -> int:
    # An episode ends at the step where every agent is done (flags are sticky).
    return int(np.count_nonzero(np.all(traj.terminated | traj.truncated, axis=-1) & ~traj.is_reset))
