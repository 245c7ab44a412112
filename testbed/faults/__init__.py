"""The fault kit: a stream of requests kept going while a part of the fleet fails.

Shared by the fault suite (``tests/faults/``, seconds-long, in ``make test``), the scale-out
harness and the soaks (``benchmarks/reliability.py``, ``benchmarks/scale_out.py``):

- :mod:`testbed.faults.counting` - a client that counts, for every request it sent, whether it
  was answered, answered twice, answered wrongly (each row checked against the in-process vector
  of that very text), failed retryably, or was lost;
- :mod:`testbed.faults.reference` - the in-process vectors those answers are compared with;
- :mod:`testbed.faults.injectors` - the faults: kill -9 of a sidecar or a runtime, a nats-server
  restart, a control-plane restart mid-promotion, a model memory budget filled up, poison input;
- :mod:`testbed.faults.scenarios` - each fault as a scenario under a counted stream;
- :mod:`testbed.faults.bad_inputs` - bad input by family, sent to a gateway;
- :mod:`testbed.faults.queue_caller` - requests put straight onto a task's queue, with the
  headers a gateway sets (any ``Tf-Key``, any minimum epoch), timed to the worker's reply.

Everything runs on loopback with real parts (nats-server, sidecar binary, PyTorch runtime).
"""
