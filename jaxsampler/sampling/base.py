"""The sampler family's contract: what every member offers (``sample``, ``sample_batch``,
``metrics``, ``reset``, ``close``, checkpoints) and how ``js.Sampler(env, ...)`` picks the
member, without importing any member (they register themselves)."""

from __future__ import annotations

import abc
import copy
import functools
import inspect
import os
import time
from pathlib import Path
from typing import Any, ClassVar

from jaxsampler.episodes import MultiAgentBatch
from jaxsampler.rollout import checkpoint
from jaxsampler.sampling.callbacks import (
    SamplerCallback,
    SampleReport,
    SamplerTotals,
    check_callbacks,
    compile_clock,
)
from jaxsampler.sampling.metrics import SamplerMetrics, check_sample_counts

__all__ = ["Sampler", "SamplerMetrics"]


class _PicksMember:
    """Holds ``Sampler.__new__`` one class above :class:`Sampler`, so that
    ``inspect.signature(Sampler)`` reports :meth:`Sampler.__init__` (the family's
    parameters) instead of ``__new__``'s ``(*args, **kwargs)``."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        """A fresh instance of the member that accepts the ``env`` argument (pathlib's
        way: Python then runs that member's ``__init__`` with the same arguments); on a
        member itself, a fresh instance of it."""
        if cls is Sampler:
            cls = Sampler._member_for(_env_argument(args, kwargs))
        return object.__new__(cls)


@functools.cache
def _family_signature() -> inspect.Signature:
    """``Sampler(...)``'s parameters without annotations (for error messages)."""
    params = inspect.signature(Sampler).parameters.values()
    return inspect.Signature([p.replace(annotation=inspect.Parameter.empty) for p in params])


def _env_argument(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The ``env`` of a ``Sampler(*args, **kwargs)`` call.

    Raises:
        TypeError: the arguments do not fit ``Sampler``'s parameters (the message shows them).
    """
    sig = _family_signature()
    try:
        return sig.bind(*args, **kwargs).arguments["env"]
    except TypeError as e:
        raise TypeError(f"Sampler{sig}: {e}") from None


class Sampler(_PicksMember, abc.ABC):
    """Samples episodes from an env with a policy (RLlib's ``EnvRunner`` role).

    ``Sampler(env, policy, ...)`` is both the documented entry point and the base class:
    called on the base it builds the member that accepts ``env`` (:meth:`accepts`), once:

    * a pure-JAX env (a :class:`~jaxsampler.envs.base.Env` or a registered id such as
      ``"CartPole-v1"`` / ``"gymnax:Acrobot-v1"``):
      :class:`~jaxsampler.sampling.device.DeviceSampler` (whole jitted rollout chunks);
    * a host-stepped env (a :class:`~jaxsampler.host_envs.base.HostEnv`, a Gymnasium env or
      vector env, a list of Gymnasium envs or factories, or ``"gym:<id>"``;
      :func:`jaxsampler.host_envs.is_host_stepped`):
      :class:`~jaxsampler.sampling.host.HostSampler` (env steps on the host, one jitted
      policy call per step).

    Either way the result is an instance of ``Sampler``: :meth:`sample` returns
    numpy'ized episodes, :meth:`sample_batch` a :class:`~jaxsampler.episodes.MultiAgentBatch`,
    :attr:`metrics` the last call's :class:`SamplerMetrics`, :meth:`reset` restarts every
    env and :meth:`close` releases the env.

    Args:
        env: a jaxsampler env, a registered env id (``js.make``), or a host-stepped env.
        policy: the policy (``(params, obs, key, state) -> (action, extras, state)``).
        num_envs: envs stepped side by side (the env axis; for ``"gym:<id>"`` the number
            of Gymnasium envs). ``None``: one pure-JAX env, or the host env's own count.
        rollout_length: steps per rollout call (device) or polls per call (host).
        seed: PRNG seed; the same seed and calls give identical episodes.
        transforms: env->policy / policy->env transforms (:mod:`jaxsampler.transforms`,
            env side first), the same semantics on both members. The policy must be
            built for ``js.rollout.pipeline_of(env, transforms).observation_space`` /
            ``.action_space``. Episodes and batches hold what the policy saw
            (transformed observations and rewards, policy-side actions); :attr:`metrics`
            report the env's own returns (raw rewards).
        explore: ``False``: the policy acts greedily (argmax / mean; see
            :func:`jaxsampler.policies.greedy.greedy`), e.g. for evaluation.
        devices, mesh: pure-JAX envs only: split the env axis over several devices (a
            count or a list) or a :class:`~jax.sharding.Mesh` with an ``"env"`` axis, which
            may span processes; see :class:`~jaxsampler.sampling.device.DeviceSampler`.
        **options: the member's own options, e.g. ``env_params`` (pure-JAX envs),
            ``episode_lookback_horizon`` (lookback steps carried into continuation
            chunks), ``callbacks``; see each member.

    Attributes:
        metrics: the :class:`SamplerMetrics` of the last ``sample()`` / ``sample_batch()``
            (of this process's envs; :meth:`global_metrics` for all processes').
    """

    #: the members by qualified name (:meth:`__init_subclass__`)
    _members: ClassVar[dict[str, type[Sampler]]] = {}

    metrics: SamplerMetrics
    callbacks: list[SamplerCallback]
    totals: SamplerTotals

    def __init__(
        self,
        env: Any,
        policy: Any,
        num_envs: int | None = None,
        rollout_length: int = 128,
        seed: int = 0,
        *,
        transforms: Any = None,
        explore: bool = True,
        devices: Any = None,
        mesh: Any = None,
        **options: Any,
    ):
        """The family's parameters (see the class docstring). ``Sampler(...)`` runs the
        chosen member's own ``__init__`` with them; members do not call this one."""

    # ------------------------------------------------------------------- the members

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Registers a subclass that defines its own :meth:`accepts` as a member."""
        super().__init_subclass__(**kwargs)
        if "accepts" in vars(cls):
            Sampler._members[f"{cls.__module__}.{cls.__qualname__}"] = cls

    @classmethod
    def accepts(cls, env: Any) -> bool:
        """Whether this member samples ``env``: ``Sampler(env, ...)`` builds the one
        member that accepts it. The base accepts nothing."""
        return False

    @staticmethod
    def _member_for(env: Any) -> type[Sampler]:
        """The one registered member that accepts ``env``.

        Raises:
            TypeError: no member, or several, accept ``env``.
        """
        found = [m for m in Sampler._members.values() if m.accepts(env)]
        if len(found) != 1:
            raise TypeError(
                f"{len(found)} sampler members accept env {env!r} "
                f"({', '.join(m.__name__ for m in found) or 'none'}); exactly one must"
            )
        return found[0]

    # ------------------------------------------------------------------- reporting

    def _init_reporting(self, callbacks: Any) -> None:
        """Sets up :attr:`callbacks` and :attr:`totals` (every member's constructor)."""
        self.callbacks = check_callbacks(callbacks)
        self.totals = SamplerTotals()
        self._clock0 = (0, 0.0)
        self._last_split = (0.0, 0.0)
        compile_clock.install()

    def _start_call(self) -> None:
        """Notes the compile clock at the start of a call."""
        self._clock0 = compile_clock.read()

    def _report(self, kind: str, rollout_s: float, convert_s: float) -> None:
        """Updates :attr:`totals` with :attr:`metrics` and calls every callback."""
        m, tot = self.metrics, self.totals
        tot.calls += 1
        tot.env_steps += m.num_env_steps_sampled
        tot.agent_steps += m.num_agent_steps_sampled
        tot.episodes += m.num_episodes_completed
        tot.rollout_calls += m.num_rollout_calls
        if not self.callbacks:
            return
        n1, s1 = compile_clock.read()
        n0, s0 = self._clock0
        report = SampleReport(
            metrics=copy.copy(m),
            totals=copy.copy(tot),
            rollout_s=rollout_s,
            convert_s=convert_s,
            compile_s=s1 - s0,
            num_compiles=n1 - n0,
            kind=kind,
        )
        for cb in self.callbacks:
            cb.on_sample_end(report)

    # ------------------------------------------------------------------- checkpoints

    def save(self, path: str | os.PathLike[str], *, overwrite: bool = False, **extra: Any) -> Path:
        """Writes everything that determines this sampler's future samples to a
        checkpoint directory at ``path`` (orbax; atomic: see :mod:`jaxsampler.rollout.checkpoint`).

        Restoring it into a sampler built the same way (:meth:`load`, :meth:`restore`),
        in this process or a fresh one, continues the run exactly: the next calls return,
        bit for bit, what this sampler's next calls would (ids, ``t_started``, lookback,
        observations, actions, rewards, infos, extras, batch columns, metrics, totals).

        What is saved: the random state; the rollout state (env states, observations,
        episode counters and steps, the policy's recurrent state, per-env and randomized
        env params, the transforms' statistics and per-env rows), or, right after a
        ``num_episodes`` call, the transforms' carried state; the episode ids' run and
        reset counter; the host side's open episode chunks with their lookback, hanging
        agent steps and running returns; :attr:`metrics` and :attr:`totals`; a
        fingerprint of the configuration (env, ``num_envs``, agents, spaces, transforms,
        policy type, lookback, rollout and topup lengths, ...). Not saved: the env,
        policy and transforms themselves (the restoring side builds them), policy params
        unless passed as ``**extra``, callbacks, compiled programs (the first call after
        a load in a fresh process compiles, as any first call does), and
        :attr:`~jaxsampler.sampling.device.DeviceSampler.last_chunks`.

        Only a :class:`~jaxsampler.sampling.device.DeviceSampler` in one process can be
        checkpointed: a :class:`~jaxsampler.sampling.host.HostSampler`'s envs live in
        host objects (Gymnasium envs, sub-processes, sockets) it cannot capture, and on a
        mesh spanning processes each process holds its own open episodes (checkpoint the
        pure rollout state with :func:`jaxsampler.rollout.checkpoint.save` there).

        Args:
            path: the checkpoint directory (must not exist unless ``overwrite``).
            overwrite: replace an existing checkpoint (for crash-safe periodic saves
                use :class:`jaxsampler.rollout.checkpoint.Checkpoints`).
            **extra: more pytrees to store in the same checkpoint (e.g. ``params=``,
                ``opt_state=``), read back by :meth:`load`.

        Returns:
            the checkpoint's path.

        Raises:
            NotImplementedError: a sampler whose state cannot be captured (a
                ``HostSampler``; a mesh spanning processes: the message says why).
            FileExistsError: ``path`` exists and ``overwrite`` is False.
        """
        arrays, host, fingerprint = self._checkpoint_parts()
        t0 = time.perf_counter()
        blob = checkpoint.dump_host(host, self._checkpoint_refs())
        out = checkpoint.save(
            path,
            arrays,
            extra=extra or None,
            meta={
                "sampler": fingerprint,
                "parts": sorted(arrays),
                "dump_host_s": time.perf_counter() - t0,
            },
            host=blob,
            overwrite=overwrite,
        )
        return out

    def load(self, path: str | os.PathLike[str], **like: Any) -> dict[str, Any]:
        """Restores this sampler from the checkpoint at ``path`` (see :meth:`save`).

        The checkpoint must come from a sampler built the same way: same env, policy,
        ``num_envs``, transforms, lookback and other options (the seed may differ: the
        checkpoint's random state and episode ids replace it). Everything is read and
        validated before anything is installed: on any error the sampler is unchanged.
        The restored arrays have the live state's shapes, dtypes and shardings, so the
        warm sampler's next calls reuse its compiled programs.

        Args:
            path: a checkpoint directory written by :meth:`save`.
            **like: for each ``extra`` tree saved with the checkpoint, a tree of the same
                structure (values or ``jax.ShapeDtypeStruct``; they fix dtypes and
                shardings); give all of them, or none (then they come back as numpy
                trees in the saved structure).

        Returns:
            the extra trees by name (``{}`` if none were saved).

        Raises:
            jaxsampler.rollout.checkpoint.CheckpointError: missing, incomplete or corrupt
                checkpoint (truncated files, a host blob failing its SHA-256 digest, a
                missing header, another format version); one written by a differently
                configured sampler (the message names each difference, e.g.
                ``num_envs: checkpoint 8, this one 16``).
            NotImplementedError: as for :meth:`save`.
        """
        live = self._checkpoint_fingerprint()  # first: a sampler that cannot load says so
        header = checkpoint.read_meta(path)
        saved = header.get("sampler")
        if not isinstance(saved, dict):
            raise checkpoint.CheckpointError(f"checkpoint {path} holds no sampler state")
        diff = checkpoint.fingerprint_mismatch(saved, live)
        if diff is not None:
            raise checkpoint.CheckpointError(
                f"checkpoint {path} was written by a differently configured sampler: {diff}"
            )
        parts = header.get("parts")
        if not isinstance(parts, list):
            raise checkpoint.CheckpointError(f"checkpoint {path} holds no sampler state")
        like_arrays = self._checkpoint_like([str(p) for p in parts])
        arrays, blob = checkpoint.restore(path, like_arrays, with_host=True)
        if blob is None:
            raise checkpoint.CheckpointError(f"checkpoint {path} holds no host state")
        host = checkpoint.load_host(blob, self._checkpoint_refs())
        extra = checkpoint.restore_extra(path, like or None)
        self._apply_checkpoint(arrays, host)  # the only step that changes the sampler
        return extra

    @classmethod
    def restore(
        cls, path: str | os.PathLike[str], env: Any, policy: Any, *args: Any, **kwargs: Any
    ) -> Sampler:
        """``Sampler(env, policy, *args, **kwargs)`` restored from the checkpoint at
        ``path`` (:meth:`load`; the constructor's arguments must be those of the sampler
        that saved it; the seed may differ). Extra trees saved with it: :meth:`load` on
        the new sampler, or :func:`jaxsampler.rollout.checkpoint.restore_extra`. The new sampler
        is closed if the load fails.

        Example (resuming a training run; see also
        :class:`jaxsampler.rollout.checkpoint.Checkpoints`)::

            sampler.save("ckpt/1000", params=params, opt_state=opt_state)
            ...  # a new process
            sampler = js.Sampler.restore("ckpt/1000", env, policy, num_envs=64)
            extra = js.rollout.checkpoint.restore_extra("ckpt/1000", like={"params": params,
                                                                   "opt_state": opt_state})
        """
        sampler: Sampler = cls(env, policy, *args, **kwargs)
        try:
            sampler.load(path)
        except BaseException:
            sampler.close()
            raise
        return sampler

    # What each member implements to be checkpointable.

    def _checkpoint_parts(self) -> tuple[dict[str, Any], Any, dict[str, Any]]:
        """``(array dict, host object, fingerprint)`` of the current state."""
        raise NotImplementedError(f"{type(self).__name__} cannot be checkpointed")

    def _checkpoint_fingerprint(self) -> dict[str, Any]:
        """JSON-able configuration that must agree between saver and restorer."""
        raise NotImplementedError(f"{type(self).__name__} cannot be checkpointed")

    def _checkpoint_like(self, parts: list[str]) -> Any:
        """The array tree's target (structure, dtypes, shardings) for a restore of a
        checkpoint whose array dict has the keys ``parts``."""
        raise NotImplementedError(f"{type(self).__name__} cannot be checkpointed")

    def _checkpoint_refs(self) -> dict[str, Any]:
        """Live objects the host state refers to by name (spaces, id generators)."""
        return {}

    def _apply_checkpoint(self, arrays: Any, host: Any) -> None:
        """Installs restored state (must not fail: everything was validated before)."""
        raise NotImplementedError(f"{type(self).__name__} cannot be checkpointed")

    # ------------------------------------------------------------------- sampling

    def sample(
        self,
        params: Any,
        num_timesteps: int | None = None,
        num_episodes: int | None = None,
        force_reset: bool = False,
    ) -> list[Any]:
        """Samples and returns numpy'ized episodes: finished ones, then ongoing chunks
        (:class:`~jaxsampler.episodes.SingleAgentEpisode` objects, or
        :class:`~jaxsampler.episodes.MultiAgentEpisode` chunks for a multi-agent env; a
        device sampler's ``episode_factory`` may build others). An ongoing chunk continues
        in the next call with the same ``id_``.

        Args:
            params: policy params (for a :class:`~jaxsampler.MultiAgentPolicy`, a dict
                ``policy_id -> params``).
            num_timesteps: sample until at least this many env steps (reset steps not
                counted); a device sampler runs whole rollout calls, so possibly more.
            num_episodes: reset, then sample until this many episodes finished; the next
                call resets again.
            force_reset: reset all envs first (ongoing episodes are discarded).

        With neither count: one rollout call (device) or ``rollout_length`` polls (host).
        Metrics of the call are in :attr:`metrics`; every callback gets its report.

        Raises:
            ValueError: both counts, or a count that is not an int >= 1.
        """
        return self._sample_call("sample", params, num_timesteps, num_episodes, force_reset)

    def sample_batch(
        self,
        params: Any,
        num_timesteps: int | None = None,
        num_episodes: int | None = None,
        force_reset: bool = False,
    ) -> MultiAgentBatch:
        """Like :meth:`sample`, but returns a ``MultiAgentBatch`` (policy id ->
        ``SampleBatch``), one row per agent step: episode by episode in :meth:`sample`'s
        order, then agent by agent, then by ``t``.

        Columns: ``obs``, ``new_obs``, ``actions``, ``rewards``, ``terminateds``,
        ``truncateds``, ``t``, ``eps_id`` (the episodes' ``id_``), ``agent_index``,
        ``infos`` and the policy's extras (``action_logp``, ``vf_preds``, ...); a device
        sampler builds them straight from its rollout buffers. Episodes continue across
        calls exactly as with :meth:`sample` (the two may be mixed).
        """
        return self._sample_call("sample_batch", params, num_timesteps, num_episodes, force_reset)

    def _sample_call(
        self,
        kind: str,
        params: Any,
        num_timesteps: int | None,
        num_episodes: int | None,
        force_reset: bool,
    ) -> Any:
        """One :meth:`sample` / :meth:`sample_batch` call: the member collects, then
        converts; both timed, then reported."""
        check_sample_counts(num_timesteps, num_episodes)
        self._start_call()
        t0 = time.perf_counter()
        collected = self._collect(params, num_timesteps, num_episodes, force_reset)
        t1 = time.perf_counter()
        out = self._episodes(collected) if kind == "sample" else self._batch(collected)
        self._last_split = (t1 - t0, time.perf_counter() - t1)
        self._report(kind, *self._last_split)
        return out

    # What each member implements to sample.

    @abc.abstractmethod
    def _collect(
        self,
        params: Any,
        num_timesteps: int | None,
        num_episodes: int | None,
        force_reset: bool,
    ) -> Any:
        """Steps the envs for one call (the counts are checked); returns what
        :meth:`_episodes` / :meth:`_batch` convert."""

    @abc.abstractmethod
    def _episodes(self, collected: Any) -> list[Any]:
        """The collected steps as episodes; sets :attr:`metrics`."""

    @abc.abstractmethod
    def _batch(self, collected: Any) -> MultiAgentBatch:
        """The collected steps as a batch; sets :attr:`metrics`."""

    def global_metrics(self) -> SamplerMetrics:
        """:attr:`metrics` of the last call combined over every process
        (:meth:`SamplerMetrics.reduce_over_processes`): a collective that every process
        calls; a copy of :attr:`metrics` in a single process."""
        return self.metrics.reduce_over_processes()

    @abc.abstractmethod
    def reset(self) -> None:
        """Resets every env; ongoing episodes are discarded."""

    def close(self) -> None:
        """Releases the env's resources (threads, processes, sockets). Idempotent."""

    def __enter__(self) -> Sampler:
        """The sampler itself (``with js.Sampler(...) as s:`` closes it at the end)."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Closes the sampler."""
        self.close()
