"""``check_env``: validate any env (built-in, gymnax-adapted or your own) before sampling.

It runs the env for a while with random actions (no auto-reset: each env stops when its
episode ends) and reports every violation of the env contract in plain words:

* ``reset``/``step`` trace and run under ``jax.jit``; identical keys give identical
  outputs (determinism);
* ``TimeStep`` layout: a leading agent axis of ``num_agents``; ``reward`` float32,
  ``terminated``/``truncated``/``acting`` bool, all ``[A]``; ``reset`` and ``step`` return
  the same pytree structure, shapes and dtypes (state and info included), as
  ``lax.scan`` requires;
* observations lie in ``observation_space`` and are finite; rewards are finite;
* the final observation of an episode is a real observation, not the next episode's
  reset: the env must not reset itself (heuristic: a state with a ``time`` counter must
  not fall back to 0 on the step that ends an episode; the final observation must not
  equal a fresh reset observation bit for bit, unless every observation of the run is
  one and the same value, as in a bandit, where that equality proves nothing);
* ``terminated`` and ``truncated`` are distinct signals (not mirrors of each other on
  every step of both runs: an env whose episodes end by termination exactly at its
  default time limit mirrors them in the default run, not in the short-limit one), and
  with a short ``max_steps_in_episode`` the time limit fires exactly at the limit;
* the per-agent contract the rollout and the host-side ``Sampler`` rely on (trivially
  met by single-agent envs): ``reset`` reports every flag False, reward 0 and at least
  one agent acting (the first observation must belong to someone); an agent's
  ``terminated``/``truncated`` flags are sticky (once done, at least one of them stays
  True until the episode ends); a done agent is not ``acting`` while the episode goes on
  and gets reward 0 on every later step; and by ``max_steps_in_episode`` every agent
  still going is truncated (or terminated), so the episode ends at the limit.

* rendering, when the env says it can (``env.can_render``): ``render(state, params)``
  traces under ``jax.jit``, returns ``uint8[H, W, 3]``, and under ``jax.vmap`` gives the
  frames of each state (what video recording relies on). :func:`first_frame` renders the
  first state after a reset (``jaxsampler check ENV`` writes it as a PNG).

* legal-action masks, when the env publishes one (a ``Dict`` observation with an
  ``"action_mask"`` entry, or an ``action_mask`` entry in its ``info``; see
  :mod:`jaxsampler.transforms.mask`): the mask has the action space's shape
  (``[A, n]`` per env for ``Discrete(n)``, ``n = sum(nvec)`` for ``MultiDiscrete``;
  ``[n]`` in the info of a single-agent env) and 0/1 values; in a run with a masked
  :class:`~jaxsampler.policies.RandomPolicy`, every acting agent has at least one legal
  action (per dimension, for ``MultiDiscrete``) and every action it samples is legal
  under the mask of the observation it acts on.

* agent groups, when the env has them (``env.agent_layout``): every agent's observation,
  read back in its own group's space, lies in that space, and the carrier padding after
  it is zero (:mod:`jaxsampler.rollout.check_groups`); problems name group and agent.

An episode ends on the step where every agent is done (``all(terminated | truncated)``
over agents, as the rollout computes it); each checked env is stopped there.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxsampler import vector
from jaxsampler.envs.base import Env
from jaxsampler.policies.base import RandomPolicy
from jaxsampler.rollout.check_groups import (
    group_layout_problems,
    group_observation_problems,
    random_actions,
)
from jaxsampler.spaces import Dict, Discrete, Space
from jaxsampler.transforms.mask import (
    MASK_KEY,
    OBS_KEY,
    lookup_info,
    mask_size,
    masked_space,
    split_masked_space,
)
from jaxsampler.types import TimeStep

__all__ = ["check_env", "EnvCheckReport", "EnvCheckError", "first_frame"]


class EnvCheckError(ValueError):
    """Raised by ``check_env(..., raise_on_error=True)``; the message lists every problem."""


@dataclasses.dataclass
class EnvCheckReport:
    """Result of :func:`check_env`: ``problems`` (violations), ``notes`` (informational)."""

    env_name: str
    problems: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    checks_run: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No problems found (notes do not count)."""
        return not self.problems

    def __str__(self) -> str:
        head = f"check_env({self.env_name}): " + (
            "OK" if self.ok else f"{len(self.problems)} problem(s)"
        )
        lines = [head]
        lines += [f"  PROBLEM: {p}" for p in self.problems]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _describe(tree: Any) -> Any:
    return jax.tree.map(lambda x: (tuple(x.shape), str(x.dtype)), tree)


def _layout_problems(ts: TimeStep, env: Env, where: str) -> list[str]:
    out = []
    A = env.num_agents
    for name, want in (
        ("reward", jnp.float32),
        ("terminated", jnp.bool_),
        ("truncated", jnp.bool_),
        ("acting", jnp.bool_),
    ):
        x = getattr(ts, name)
        if tuple(x.shape) != (A,):
            out.append(
                f"{where}: TimeStep.{name} has shape {tuple(x.shape)}, expected ({A},) (one entry "
                "per agent)"
            )
        if x.dtype != want:
            out.append(f"{where}: TimeStep.{name} has dtype {x.dtype}, expected {jnp.dtype(want)}")
    space_leaves = jax.tree.leaves(env.observation_space.zeros())
    obs_leaves = jax.tree.leaves(ts.obs)
    if len(space_leaves) != len(obs_leaves):
        out.append(
            f"{where}: observation has {len(obs_leaves)} leaves, the observation space "
            f"{len(space_leaves)}"
        )
    for s, o in zip(space_leaves, obs_leaves):
        if tuple(o.shape) != (A,) + tuple(s.shape):
            out.append(
                f"{where}: observation has shape {tuple(o.shape)}, expected "
                f"{(A,) + tuple(s.shape)} "
                f"(agent axis {A} + observation space shape)"
            )
        elif o.dtype != s.dtype:
            out.append(
                f"{where}: observation dtype {o.dtype} differs from the observation space's "
                f"{s.dtype}"
            )
    return out


def _contains_all(space: Space, obs: Any, batch_ndim: int) -> np.ndarray:
    """``bool[*batch]`` from obs leaves ``[*batch, ...]`` (``batch_ndim`` leading dims)."""
    fn = space.contains
    for _ in range(batch_ndim):
        fn = jax.vmap(fn)
    return np.asarray(fn(obs))


@functools.lru_cache(maxsize=32)
def _jitted(env: Env) -> tuple[Any, Any]:
    """Jitted ``(reset, step)`` of ``env``; cached, so repeated checks compile once."""
    return jax.jit(env.reset), jax.jit(env.step)


@functools.lru_cache(maxsize=32)
def _episode_runner(env: Env, num_envs: int, num_steps: int) -> Any:
    """Jitted ``run(key, params)``: steps ``num_envs`` envs with random actions; each stops
    (is frozen) when its episode ends. Cached, so repeated checks compile once."""

    def run(key: jax.Array, params: Any):
        k_reset, k_run = jax.random.split(key)
        state, ts = vector.reset(env, jax.random.split(k_reset, num_envs), params)

        def body(carry, key):
            state, ts, alive = carry
            k_act, k_step, k_re = jax.random.split(key, 3)
            action = random_actions(env, k_act, (num_envs,))
            new_state, new_ts = vector.step(
                env, jax.random.split(k_step, num_envs), state, action, params
            )
            _, fresh = vector.reset(env, jax.random.split(k_re, num_envs), params)
            done = jnp.all(new_ts.terminated | new_ts.truncated, axis=-1)
            new_state = vector.select_envs(alive, new_state, state)
            new_ts = vector.select_envs(alive, new_ts, ts)
            time = getattr(new_state, "time", None)
            rec = {
                "alive": alive,
                "obs": new_ts.obs,
                "reward": new_ts.reward,
                "terminated": new_ts.terminated,
                "truncated": new_ts.truncated,
                "acting": new_ts.acting,
                "done": done & alive,
                "time": jnp.zeros((num_envs,), jnp.int32)
                if time is None
                else jnp.asarray(time, jnp.int32).reshape(num_envs),
                "reset_obs": fresh.obs,
            }
            return (new_state, new_ts, alive & ~done), rec

        _, rec = jax.lax.scan(
            body, (state, ts, jnp.ones((num_envs,), jnp.bool_)), jax.random.split(k_run, num_steps)
        )
        first = {
            f"first_{name}": getattr(ts, name)
            for name in ("obs", "reward", "terminated", "truncated", "acting")
        }
        return first, rec

    return jax.jit(run)


def _run_episodes(
    env: Env, params: Any, key: jax.Array, num_envs: int, num_steps: int
) -> dict[str, Any]:
    """Host copies of the run: ``first_*`` (the reset ``TimeStep``, ``[N, A, ...]``) and the
    per-step records (``[S, N, ...]``; scan index ``t`` is step ``t + 1`` of the episode)."""
    first, rec = jax.device_get(_episode_runner(env, num_envs, num_steps)(key, params))
    return {**first, **rec}


def check_env(
    env: Env,
    params: Any = None,
    *,
    seed: int = 0,
    num_envs: int = 16,
    num_steps: int | None = None,
    short_time_limit: int = 7,
    raise_on_error: bool = False,
    info_mask_path: str = MASK_KEY,
) -> EnvCheckReport:
    """Validates ``env`` and returns a report listing every problem found.

    Args:
        env: the env to check.
        params: env params (default ``env.default_params``).
        seed: PRNG seed of the random actions and resets.
        num_envs: envs run side by side.
        num_steps: steps per env (default: the time limit + 1, at most 1000; with a time
            limit in params, at least ``short_time_limit + 2``, so both runs share one
            compiled runner).
        short_time_limit: the ``max_steps_in_episode`` used to check that truncation
            fires exactly at the limit, for every agent (if params have that field).
        raise_on_error: raise :class:`EnvCheckError` instead of returning a failing report.
        info_mask_path: where a legal-action mask published in ``info`` sits (an
            attribute or key, dotted for nested ones; as ``ActionMaskFromInfo(path=)``).
    """
    report = EnvCheckReport(getattr(env, "name", type(env).__name__))
    if not isinstance(env, Env):
        report.problems.append(
            f"{type(env).__name__} is not a jaxsampler Env "
            "(wrap gymnax envs with js.envs.from_gymnax)"
        )
        return _finish(report, raise_on_error)
    try:
        hash(env)
    except TypeError:
        report.problems.append(
            f"{type(env).__name__} is not hashable: make it a frozen dataclass (compiled code is "
            "cached per env)"
        )
        return _finish(report, raise_on_error)
    report.problems += group_layout_problems(env)
    if report.problems:  # the carrier spaces come from the layout
        return _finish(report, raise_on_error)
    params = env.default_params if params is None else params
    key = jax.random.PRNGKey(seed)
    for what in ("observation_space", "action_space"):
        if not isinstance(getattr(env, what), Space):
            report.problems.append(
                f"env.{what} is {type(getattr(env, what)).__name__}, not a jaxsampler Space"
            )
    if report.problems:
        return _finish(report, raise_on_error)

    # --- jit, determinism, layout ---------------------------------------------------
    report.checks_run.append("jit and determinism")
    try:
        reset, step = _jitted(env)
        s0, ts0 = reset(key, params)
        s0b, ts0b = reset(key, params)
        action = random_actions(env, jax.random.fold_in(key, 7), ())
        s1, ts1 = step(jax.random.fold_in(key, 1), s0, action, params)
        s1b, ts1b = step(jax.random.fold_in(key, 1), s0b, action, params)
    except Exception as e:  # report, do not crash: the user asked for a diagnosis
        report.problems.append(f"reset/step failed under jax.jit: {type(e).__name__}: {e}")
        return _finish(report, raise_on_error)
    if not _tree_equal((s0, ts0), (s0b, ts0b)):
        report.problems.append("reset is not deterministic: the same key gave different outputs")
    if not _tree_equal((s1, ts1), (s1b, ts1b)):
        report.problems.append(
            "step is not deterministic: the same key, state and action gave different outputs"
        )
    report.checks_run.append("TimeStep layout")
    for ts, where in ((ts0, "reset"), (ts1, "step")):
        report.problems += _layout_problems(ts, env, where)
    reset_def: Any = jax.tree.structure((s0, ts0))  # PyTreeDef: untyped for mypy
    if _describe((s0, ts0)) != _describe((s1, ts1)) or reset_def != jax.tree.structure((s1, ts1)):
        report.problems.append(
            "reset and step return different pytrees (structure, shape or dtype of "
            "state/TimeStep/info differ); "
            "lax.scan needs them identical. reset: "
            f"{_describe(ts0)}; step: {_describe(ts1)}"
        )
    if report.problems:
        return _finish(report, raise_on_error)
    if getattr(env, "can_render", False):
        report.checks_run.append("render")
        report.problems += _render_problems(env, params, key)

    # --- a run of episodes -----------------------------------------------------------
    limit = getattr(params, "max_steps_in_episode", None)
    if num_steps is None:
        num_steps = min(int(limit) + 1, 1000) if limit is not None else 500
    if limit is not None and hasattr(params, "replace"):
        num_steps = max(num_steps, short_time_limit + 2)  # one runner (and compile) for both runs
    rec = _run_episodes(env, params, jax.random.fold_in(key, 2), num_envs, num_steps)
    _check_run(env, rec, report, limit)
    if env.agent_layout is not None:
        report.checks_run.append("agent groups: own observation spaces, zero padding")
        report.problems += group_observation_problems(env.agent_layout, rec)
    runs = [rec]  # the runs whose flags tell terminated from truncated
    report.checks_run.append("reset TimeStep")
    report.problems += _reset_problems(rec)
    report.checks_run.append("done agents (sticky flags, acting, reward)")
    agent_problems = _done_agent_problems(rec)
    _check_masks(
        env, params, ts0, jax.random.fold_in(key, 4), num_envs, num_steps, info_mask_path, report
    )

    # --- time limit -----------------------------------------------------------------
    report.checks_run.append("time limit")
    if limit is None or not hasattr(params, "replace"):
        report.notes.append("params have no max_steps_in_episode: time-limit checks skipped")
    else:
        short = params.replace(max_steps_in_episode=short_time_limit)
        rec_s = _run_episodes(env, short, jax.random.fold_in(key, 3), num_envs, num_steps)
        runs.append(rec_s)
        for kind, problem in _done_agent_problems(rec_s).items():
            agent_problems.setdefault(kind, problem)  # one report per kind of violation
        multi = env.num_agents > 1
        alive = rec_s["alive"]
        trunc_a = rec_s["truncated"] & alive[..., None]  # [S, N, A]
        steps_taken = np.cumsum(alive, axis=0)  # 1-based step index per env
        early = trunc_a & (steps_taken < short_time_limit)[..., None]
        if early.any():
            t, env_i, a = np.argwhere(early)[0]
            report.problems.append(
                f"truncated fired at step {steps_taken[t, env_i]} of env "
                f"{env_i}{f', agent {a}' if multi else ''}, "
                f"before max_steps_in_episode={short_time_limit}"
            )
        # Per agent, not "any agent": the episode ends only when every agent is done.
        going = ~(rec_s["terminated"] | rec_s["truncated"])
        missed = (alive & (steps_taken >= short_time_limit))[..., None] & going
        if missed.any():
            t, env_i, a = np.argwhere(missed)[0]
            report.problems.append(
                f"time limit did not fire{f' for agent {a}' if multi else ''}: env {env_i} is "
                "still running after "
                f"{steps_taken[t, env_i]} steps with max_steps_in_episode={short_time_limit}"
                + (
                    " (every agent still going at the limit must be truncated or terminated)"
                    if multi
                    else ""
                )
            )
    # Merged flags are equal on every step of every run. An env whose episodes end by
    # termination exactly at the default time limit (DeepSea) mirrors them in the default
    # run only: the short-limit run truncates it first, which tells the two apart.
    report.checks_run.append("terminated vs truncated")
    fired = any(np.any(np.asarray(r["truncated"]) & r["alive"][..., None]) for r in runs)
    if fired and all(_flags_mirror(r) for r in runs):
        report.problems.append("terminated mirrors truncated exactly: the two signals look merged")
    report.problems += list(agent_problems.values())
    return _finish(report, raise_on_error)


def _reset_problems(rec: dict[str, Any]) -> list[str]:
    """Violations of the reset ``TimeStep`` contract (first occurrence of each kind)."""
    out = []
    nobody = ~rec["first_acting"].any(-1)  # [N]
    if nobody.any():
        e = int(np.argmax(nobody))
        out.append(
            f"nobody acts at reset in env {e}: at least one agent must be acting, "
            "or the first observation belongs to nobody"
        )
    flagged = rec["first_terminated"] | rec["first_truncated"]  # [N, A]
    if flagged.any():
        e, a = np.argwhere(flagged)[0]
        out.append(
            f"reset reports agent {a} of env {e} as terminated or truncated: "
            "every episode must start with all flags False"
        )
    rewarded = rec["first_reward"] != 0
    if rewarded.any():
        e, a = np.argwhere(rewarded)[0]
        r = rec["first_reward"][e, a]
        out.append(f"reset gives agent {a} of env {e} reward {r}: reward must be 0 after a reset")
    return out


def _done_agent_problems(rec: dict[str, Any]) -> dict[str, str]:
    """Per-agent end-of-episode violations in one run, the first of each kind.

    A done agent (terminated or truncated) must keep a flag set, not act while the
    episode goes on and get reward 0 on every later step of its episode.
    """
    alive = rec["alive"][..., None]  # [S, N, 1]; env stopped after its episode ended
    done = (rec["terminated"] | rec["truncated"]) & alive  # [S, N, A]
    done_before = np.zeros_like(done)
    done_before[1:] = np.logical_or.accumulate(done, axis=0)[:-1]
    first_done = np.argmax(done, axis=0) + 1  # [N, A]: step it finished (where done_before)
    goes_on = ~rec["done"][..., None]  # the episode continues after this step
    out: dict[str, str] = {}
    bad = done_before & alive & ~done
    if bad.any():
        t, e, a = np.argwhere(bad)[0]
        out["sticky"] = (
            f"done flags are not sticky: agent {a} of env {e} was done at step {first_done[e, a]} "
            "but reports "
            f"neither terminated nor truncated at step {t + 1}, while the episode goes on "
            "(a done agent keeps its flag until the episode ends)"
        )
    bad = done & rec["acting"] & goes_on
    if bad.any():
        t, e, a = np.argwhere(bad)[0]
        out["acting"] = (
            f"done agent still acting: agent {a} of env {e} is done at step {t + 1} but acting is "
            "True "
            "while the episode goes on (acting must be False for done agents)"
        )
    bad = done_before & alive & (rec["reward"] != 0)
    if bad.any():
        t, e, a = np.argwhere(bad)[0]
        out["reward"] = (
            f"done agent still rewarded: agent {a} of env {e} was done at step {first_done[e, a]} "
            "but gets reward "
            f"{rec['reward'][t, e, a]} at step {t + 1} (reward must be 0 once an agent is done)"
        )
    return out


def _check_max_acting(env: Env, rec: dict[str, Any], report: EnvCheckReport) -> None:
    """An env that declares ``max_acting`` never has more agents acting in one step (the
    rollout runs the policy on that many rows per env, so more would go without action)."""
    k = getattr(env, "max_acting", None)
    if k is None:
        return
    report.checks_run.append(f"at most max_acting={k} agents act per step")
    counts = [
        ("reset", np.asarray(rec["first_acting"]).sum(-1)[None]),  # [1, N]
        ("step", (np.asarray(rec["acting"]) & rec["alive"][..., None]).sum(-1)),  # [S, N]
    ]
    for where, count in counts:
        if (count > k).any():
            t, e = np.argwhere(count > k)[0]
            at = "the reset" if where == "reset" else f"step {t + 1}"
            report.problems.append(
                f"{count[t, e]} agents act at {at} of env {e}, but the env declares "
                f"max_acting={k}: the rollout would give the extra agents no action"
            )
            return


def _check_end_together(env: Env, rec: dict[str, Any], report: EnvCheckReport) -> None:
    """An env that declares ``agents_end_together`` never has an agent done while another
    is not (the rollout then skips the critic on rows it would bootstrap such an agent
    from)."""
    if not getattr(env, "agents_end_together", False):
        return
    report.checks_run.append("every agent's episode ends at the same step")
    done = (np.asarray(rec["terminated"]) | np.asarray(rec["truncated"])) & rec["alive"][..., None]
    split = done.any(-1) & ~done.all(-1)  # [S, N]
    if split.any():
        t, e = np.argwhere(split)[0]
        who = np.flatnonzero(done[t, e]).tolist()
        report.problems.append(
            f"agents {who} of env {e} are done at step {t + 1} while the others play on, but "
            "the env declares agents_end_together=True: their bootstrap values would be "
            "read from rows the rollout leaves without a value"
        )


def _check_run(env: Env, rec: dict[str, Any], report: EnvCheckReport, limit: Any) -> None:
    alive = rec["alive"]  # [S, N]
    report.checks_run.append("observations in space")
    inside = _contains_all(env.observation_space, rec["obs"], 3) | ~alive[..., None]
    first_inside = _contains_all(env.observation_space, rec["first_obs"], 2)
    if not first_inside.all():
        report.problems.append(f"reset observation outside {env.observation_space!r}")
    if not inside.all():
        t, e, a = np.argwhere(~inside)[0]
        bad = jax.tree.map(lambda x: np.asarray(x)[t, e, a], rec["obs"])
        report.problems.append(
            f"observation outside {env.observation_space!r} at step {t + 1} of env {e}, agent "
            f"{a}: {bad}"
        )
    report.checks_run.append("finite values")
    for name, tree in (("observation", rec["obs"]), ("reward", rec["reward"])):
        for leaf in jax.tree.leaves(tree):
            leaf = np.asarray(leaf)
            if np.issubdtype(leaf.dtype, np.inexact):
                bad = ~np.isfinite(leaf.reshape(leaf.shape[:2] + (-1,))).all(-1) & alive
                if bad.any():
                    t, e = np.argwhere(bad)[0]
                    report.problems.append(f"non-finite {name} at step {t + 1} of env {e}")
    _check_max_acting(env, rec, report)
    _check_end_together(env, rec, report)
    report.checks_run.append("final observation is real")
    done = rec["done"]
    if not done.any():
        report.notes.append(
            f"no episode ended within {alive.shape[0]} random steps: end-of-episode checks skipped"
        )
        return
    t_idx, e_idx = np.nonzero(done)
    if np.any(rec["time"][done] == 0) and np.any(rec["time"] != 0):
        report.problems.append(
            "the state's time counter is 0 on the step that ends an episode: the env seems to "
            "reset itself, "
            "so the final observation is the next episode's first one (let jaxsampler auto-reset)"
        )
    final = [np.asarray(x)[t_idx, e_idx] for x in jax.tree.leaves(rec["obs"])]
    fresh = [np.asarray(x)[t_idx, e_idx] for x in jax.tree.leaves(rec["reset_obs"])]
    same = np.ones(len(t_idx), bool)
    for f, r in zip(final, fresh):
        same &= (f.reshape(len(t_idx), -1) == r.reshape(len(t_idx), -1)).all(-1)
    if same.all() and len(same) > 1:
        if _constant_obs(rec):
            # Every observation of the run is one and the same value (e.g. a bandit's
            # constant obs): final == reset is then no evidence of a self-reset.
            report.notes.append(
                "every observation of the run is identical: the final-observation check "
                "cannot tell a self-reset (the time-counter check still ran)"
            )
        else:
            report.problems.append(
                "every final observation equals a reset observation: the env resets itself"
            )


def _constant_obs(rec: dict[str, Any]) -> bool:
    """Whether every observation of the run (reset and live steps) equals the first."""
    alive = np.asarray(rec["alive"])
    for first, steps in zip(jax.tree.leaves(rec["first_obs"]), jax.tree.leaves(rec["obs"])):
        first, steps = np.asarray(first), np.asarray(steps)
        ref = first.reshape(-1)[: first[0, 0].size]
        if not (first.reshape(first.shape[:2] + (-1,)) == ref).all():
            return False
        if not (steps[alive].reshape(-1, ref.size) == ref).all():
            return False
    return True


def _flags_mirror(rec: dict[str, Any]) -> bool:
    """Whether ``terminated`` equals ``truncated`` on every live step of the run."""
    alive = rec["alive"]
    term = np.any(rec["terminated"], -1) & alive
    trunc = np.any(rec["truncated"], -1) & alive
    return bool(np.array_equal(term, trunc))


def _mask_source(env: Env, ts: TimeStep, path: str) -> tuple[str, str] | None:
    """Where ``env`` publishes a legal-action mask: ``("obs", key)``, ``("info", path)``
    or ``None``."""
    space = env.observation_space
    if isinstance(space, Dict) and MASK_KEY in space.spaces:
        return ("obs", MASK_KEY)
    try:
        lookup_info(ts.info, path)
    except KeyError:
        return None
    return ("info", path)


def _get_mask(ts: TimeStep, source: tuple[str, str], batch: tuple[int, ...]) -> jax.Array:
    """The mask of ``ts`` as ``[*batch, A, n]`` (an info mask of one agent may lack ``A``)."""
    where, path = source
    mask = jnp.asarray(ts.obs[path] if where == "obs" else lookup_info(ts.info, path))
    return mask if mask.ndim == len(batch) + 2 else mask[..., None, :]


@functools.lru_cache(maxsize=32)
def _masked_runner(env: Env, num_envs: int, num_steps: int, source: tuple[str, str]) -> Any:
    """Jitted ``run(key, params)``: like :func:`_episode_runner`, with the actions of a
    masked :class:`RandomPolicy`; records ``mask``, ``action``, ``acting`` (of the
    observation acted on) and ``alive``. Cached, so repeated checks compile once."""
    policy = RandomPolicy(masked_space(Discrete(1), env.action_space), env.action_space)

    def run(key: jax.Array, params: Any):
        k_reset, k_run = jax.random.split(key)
        state, ts = vector.reset(env, jax.random.split(k_reset, num_envs), params)

        def body(carry, key):
            state, ts, alive = carry
            k_act, k_step = jax.random.split(key)
            mask = _get_mask(ts, source, (num_envs,))
            dummy = jnp.zeros(mask.shape[:2], jnp.int32)
            action, _, _ = policy((), {OBS_KEY: dummy, MASK_KEY: mask}, k_act, ())
            new_state, new_ts = vector.step(
                env, jax.random.split(k_step, num_envs), state, action, params
            )
            done = jnp.all(new_ts.terminated | new_ts.truncated, axis=-1)
            rec = {"alive": alive, "mask": mask, "action": action, "acting": ts.acting}
            new_state = vector.select_envs(alive, new_state, state)
            new_ts = vector.select_envs(alive, new_ts, ts)
            return (new_state, new_ts, alive & ~done), rec

        _, rec = jax.lax.scan(
            body, (state, ts, jnp.ones((num_envs,), jnp.bool_)), jax.random.split(k_run, num_steps)
        )
        return rec

    return jax.jit(run)


def _check_masks(
    env: Env,
    params: Any,
    ts0: TimeStep,
    key: jax.Array,
    num_envs: int,
    num_steps: int,
    path: str,
    report: EnvCheckReport,
) -> None:
    """The legal-action mask checks (see the module docstring); nothing without a mask."""
    source = _mask_source(env, ts0, path)
    if source is None:
        return
    report.checks_run.append("action mask")
    where = f"observation entry {MASK_KEY!r}" if source[0] == "obs" else f"info entry {path!r}"
    space = env.action_space
    try:
        n = mask_size(space)
        if source[0] == "obs":
            split_masked_space(env.observation_space, space)
    except (TypeError, ValueError) as err:
        report.problems.append(f"action mask ({where}): {err}")
        return
    A = env.num_agents
    mask0 = jnp.asarray(lookup_info(ts0.obs if source[0] == "obs" else ts0.info, path))
    ok_shapes = [(A, n)] + ([(n,)] if A == 1 and source[0] == "info" else [])
    if tuple(mask0.shape) not in ok_shapes:
        report.problems.append(
            f"action mask ({where}) has shape {tuple(mask0.shape)} per env, expected "
            f"{' or '.join(map(str, ok_shapes))} ({A} agent(s), {n} actions of {space!r})"
        )
        return
    if not (mask0.dtype == jnp.bool_ or jnp.issubdtype(mask0.dtype, jnp.number)):
        report.problems.append(f"action mask ({where}) has dtype {mask0.dtype}, not bool/int/float")
        return
    rec = jax.device_get(_masked_runner(env, num_envs, num_steps, source)(key, params))
    acts = rec["acting"] & rec["alive"][..., None]  # [S, N, A]
    mask = np.asarray(rec["mask"])  # [S, N, A, n]
    if mask.dtype != np.bool_:
        odd = acts & ~np.all((mask == 0) | (mask == 1), axis=-1)
        if odd.any():
            t, e, a = np.argwhere(odd)[0]
            report.problems.append(
                f"action mask ({where}) has values other than 0/1 for agent {a} of env {e} at "
                f"step {t}: {mask[t, e, a].tolist()} (nonzero counts as legal)"
            )
    legal = mask.astype(bool)
    nvec = getattr(space, "nvec", None)
    sizes = [n] if nvec is None else np.asarray(nvec).reshape(-1).tolist()
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    action = np.asarray(rec["action"]).reshape(acts.shape + (-1,)).astype(np.int64)
    if isinstance(space, Discrete):
        action = action - space.start
    none_legal = np.zeros(acts.shape, bool)
    chosen_legal = np.ones(acts.shape, bool)
    for d, (start, size) in enumerate(zip(starts, sizes)):
        seg = legal[..., start : start + size]
        none_legal |= ~seg.any(-1)
        idx = np.clip(action[..., d], 0, size - 1)
        inside = (action[..., d] >= 0) & (action[..., d] < size)
        chosen_legal &= inside & np.take_along_axis(seg, idx[..., None], -1)[..., 0]
    bad = acts & none_legal
    if bad.any():
        t, e, a = np.argwhere(bad)[0]
        per_dim = "" if isinstance(space, Discrete) else " in some dimension"
        report.problems.append(
            f"agent {a} of env {e} acts at step {t} with no legal action{per_dim}: its action "
            f"mask ({where}) is all False (an acting agent needs at least one legal action)"
        )
    bad = acts & ~none_legal & ~chosen_legal
    if bad.any():
        t, e, a = np.argwhere(bad)[0]
        report.problems.append(
            f"a masked random policy sampled the illegal action {rec['action'][t, e, a]} for "
            f"agent {a} of env {e} at step {t} (mask {where}: {mask[t, e, a].tolist()})"
        )
    if not acts.any():
        report.notes.append("no agent acted in the masked run: action-mask checks skipped")


def _render_problems(env: Env, params: Any, key: jax.Array) -> list[str]:
    """Problems of ``env.render``: under jit, its frame type, and its vmap."""
    try:
        states, _ = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))(
            jax.random.split(key, 2), params
        )
        render = jax.jit(env.render)
        one = np.asarray(render(jax.tree.map(lambda x: x[1], states), params))
        both = np.asarray(jax.jit(jax.vmap(env.render, in_axes=(0, None)))(states, params))
    except Exception as e:  # report, do not crash
        return [f"render failed under jax.jit / jax.vmap: {type(e).__name__}: {e}"]
    if one.dtype != np.uint8 or one.ndim != 3 or one.shape[-1] != 3:
        return [f"render must return uint8[H, W, 3], got {one.dtype}{list(one.shape)}"]
    if not np.array_equal(both[1], one):
        return ["render under jax.vmap differs from render of the single state"]
    return []


def first_frame(env: Env, params: Any = None, *, seed: int = 0) -> np.ndarray | None:
    """The frame of the first state after ``env.reset(jax.random.PRNGKey(seed), params)``,
    ``uint8[H, W, 3]`` numpy; ``None`` when the env cannot render (``can_render`` False)."""
    if not getattr(env, "can_render", False):
        return None
    params = env.default_params if params is None else params
    state, _ = jax.jit(env.reset)(jax.random.PRNGKey(seed), params)
    return np.asarray(jax.jit(env.render)(state, params))


def _tree_equal(a: Any, b: Any) -> bool:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    a_def: Any = jax.tree.structure(a)  # PyTreeDef: untyped for mypy
    return a_def == jax.tree.structure(b) and all(
        np.array_equal(
            np.asarray(x), np.asarray(y), equal_nan=np.issubdtype(np.asarray(x).dtype, np.inexact)
        )
        for x, y in zip(la, lb)
    )


def _finish(report: EnvCheckReport, raise_on_error: bool) -> EnvCheckReport:
    if raise_on_error and report.problems:
        raise EnvCheckError(str(report))
    return report
