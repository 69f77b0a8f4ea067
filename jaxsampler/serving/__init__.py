"""Policy serving over HTTP: :class:`PolicyServer` (a host env fed by remote simulators)
and :class:`PolicyClient` (the simulator's side, remote or local inference), speaking the
protocol of :mod:`jaxsampler.serving.protocol`."""

from jaxsampler.serving.client import PolicyClient
from jaxsampler.serving.protocol import (
    PROTOCOL_VERSION,
    PolicyServerError,
    SequenceError,
    ServerRestartedError,
    ServerUnavailableError,
)
from jaxsampler.serving.server import PolicyServer

__all__ = [
    "PROTOCOL_VERSION",
    "PolicyClient",
    "PolicyServer",
    "PolicyServerError",
    "SequenceError",
    "ServerRestartedError",
    "ServerUnavailableError",
]
