"""``npurt serve``: one process owns the device and the compiled models; other processes run them through it.

Clients: ``npurt.connect(socket=None).open_runner(name)`` gives an ``npurt.Runner`` whose engine runs in the service
(tensors registered once by fd, runs as 20-byte messages). After ``RunnerFactory.register_backend("SERVICE",
RemoteBackend)``, ``RunnerFactory.create_runner("SERVICE", name, {"service": socket})`` does the same with a
connection of its own. The service: ``npurt serve --model NAME=PATH``. See docs/serve.md.

The modules, each importing only those listed before it: ``protocol`` (the messages), ``limits`` (what a service
gives, who a peer is); on the client side ``connection`` (one connection), ``remote`` (a Runner's engine over it),
``client`` (a connection that opens runners); in the service ``served`` (one served model, its workers and fair
queue, answering each job through its ``JobOwner``), ``session`` (one client: a JobOwner), ``server`` (the
``Service``: the socket, admission, shutdown); ``process`` (starting a service) and ``readiness`` (telling that it is
ready).
"""

from .client import ServiceClient, connect
from .protocol import default_socket_path
from .remote import RemoteBackend, RemoteEngine

__all__ = ["RemoteBackend", "RemoteEngine", "ServiceClient", "connect", "default_socket_path"]
