"""The envs row: the :class:`Env` protocol and its single-agent and multi-agent bases,
the built-in pure-JAX envs, the suite adapters (``from_<suite>``) and the registry
(:func:`make`)."""

from jaxsampler.envs.acrobot import Acrobot
from jaxsampler.envs.adapters.brax import from_brax
from jaxsampler.envs.adapters.gymnax import from_gymnax
from jaxsampler.envs.adapters.jaxmarl import from_jaxmarl
from jaxsampler.envs.adapters.jumanji import from_jumanji
from jaxsampler.envs.adapters.pgx import from_pgx
from jaxsampler.envs.base import Env, MultiAgentEnv, SingleAgentEnv
from jaxsampler.envs.cartpole import CartPole
from jaxsampler.envs.mountain_car import MountainCar
from jaxsampler.envs.mountain_car_continuous import MountainCarContinuous
from jaxsampler.envs.pendulum import Pendulum
from jaxsampler.envs.predator_prey import PredatorPrey
from jaxsampler.envs.registry import make, make_jax_env, register, registered_ids
from jaxsampler.envs.spread import Spread

__all__ = [
    "Acrobot",
    "CartPole",
    "Env",
    "MountainCar",
    "MountainCarContinuous",
    "MultiAgentEnv",
    "Pendulum",
    "PredatorPrey",
    "SingleAgentEnv",
    "Spread",
    "from_brax",
    "from_gymnax",
    "from_jaxmarl",
    "from_jumanji",
    "from_pgx",
    "make",
    "make_jax_env",
    "register",
    "registered_ids",
]
