"""The real parts a test or a benchmark starts on loopback, importable by both.

`tests/` and `benchmarks/` share these; neither imports the other's modules for them:

- `fleet` - a local fleet (nats-server, placement publisher, fleet watcher, sidecars and
  runtimes), registering a served task, waiting for a condition, reading heartbeats;
- `machines` - every role its own OS process, as separate machines run it;
- `postgres` - a throwaway PostgreSQL server;
- `infinity` - the infinity-emb peer engine on loopback;
- `tiny_model` - tiny random BERT models, adapters and heads built in a second;
- `declared_tasks` - tasks on a declared suite (a record, no data);
- `gerlayqa` - passages of the shared GerLayQA data;
- `production` - `taskfleet up` driven from outside: replays with feedback, live runs, offline
  evals of the replayed items;
- `faults/` - the fault kit: counting client, reference vectors, injectors, scenarios.

Not part of the distribution (like `tests/` and `benchmarks/`); checked by mypy.
"""
