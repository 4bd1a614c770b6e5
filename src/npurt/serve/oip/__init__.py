"""KServe's Open Inference Protocol (v2) for ``npurt serve``: HTTP/REST (aiohttp) and gRPC (grpcio), with Triton's
binary tensor, system shared memory, statistics and model configuration extensions and Prometheus metrics. Needs
the ``serve`` extra.

The modules, each importing only those listed before it: ``codec`` (the messages), ``shm`` (shared memory
regions), ``metrics``, ``statistics`` (Triton's, per model), ``logs`` (what clients can make the server log,
bounded), ``inference`` (what both protocols share: models, requests as jobs of the served models, drain),
``http`` and ``grpc_front`` (the two servers), ``server`` (settings, safety checks, both servers together).
"""
