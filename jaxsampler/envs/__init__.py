"""Built-in pure-JAX environments and adapters."""

from jaxsampler.envs.acrobot import Acrobot
from jaxsampler.envs.cartpole import CartPole
from jaxsampler.envs.mountain_car import MountainCar
from jaxsampler.envs.mountain_car_continuous import MountainCarContinuous
from jaxsampler.envs.pendulum import Pendulum
from jaxsampler.envs.spread import Spread

__all__ = ["Acrobot", "CartPole", "MountainCar", "MountainCarContinuous", "Pendulum", "Spread"]
