"""The fault suite: a stream of requests kept going while a part of the fleet fails.

Importable pieces, reused by the scale-out work and by ``benchmarks/reliability.py``:

- :mod:`tests.faults.counting` - a client that counts, for every request it sent, whether it was
  answered, answered twice, answered wrongly (each row checked against the in-process vector of
  that very text), failed retryably, or was lost;
- :mod:`tests.faults.reference` - the in-process vectors those answers are compared with;
- :mod:`tests.faults.injectors` - the faults: kill -9 of a sidecar or a runtime, a nats-server
  restart, a control-plane restart mid-promotion, a model memory budget filled up, poison input.

Everything runs on loopback with real parts (nats-server, sidecar binary, PyTorch runtime).
"""
