"""``npurt serve``: one process owns the device and the compiled models; other processes run them through it.

Clients: ``npurt.connect(socket=None).open_runner(name)`` gives an ``npurt.Runner`` whose engine runs in the service
(tensors registered once by fd, runs as 20-byte messages). After ``RunnerFactory.register_backend("SERVICE",
RemoteBackend)``, ``RunnerFactory.create_runner("SERVICE", name, {"service": socket})`` does the same with a
connection of its own. The service: ``npurt serve --model NAME=PATH``. See docs/serve.md.

The modules: ``client`` (one connection), ``remote`` (a Runner's engine over it), ``protocol`` (the messages);
``server`` (the ``Service``: the socket, admission, shutdown), ``session`` (one client in the service), ``served``
(one served model, its workers and fair queue); ``process`` (starting a service) and ``readiness`` (telling that it is
ready).
"""

from .client import ServiceClient, connect
from .protocol import default_socket_path
from .remote import RemoteBackend, RemoteEngine

__all__ = ["RemoteBackend", "RemoteEngine", "ServiceClient", "connect", "default_socket_path"]
