"""``npurt serve``: one process owns the device and the compiled models; other processes run them through it.

Clients: ``npurt.connect(socket=None).open_runner(name)`` gives an ``npurt.Runner`` whose engine runs in the service
(tensors registered once by fd, runs as 20-byte messages). After ``RunnerFactory.register_backend("SERVICE",
RemoteBackend)``, ``RunnerFactory.create_runner("SERVICE", name, {"service": socket})`` does the same with a
connection of its own. The service: ``npurt serve --model NAME=PATH``
(``npurt.serve.server.Service``). The protocol: ``npurt.serve.protocol``; see docs/serve.md.
"""

from .client import RemoteBackend, RemoteEngine, ServiceClient, connect
from .protocol import default_socket_path

__all__ = ["RemoteBackend", "RemoteEngine", "ServiceClient", "connect", "default_socket_path"]
