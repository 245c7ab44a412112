"""What every taskfleet HTTP app shares at its edge and imports from no other app.

- `httpapi.errors`: the public error shape and the one list of error codes (no framework import,
  so clients and the CLI can use it too);
- `httpapi.handlers`: the FastAPI exception handlers that answer every failure in that shape,
  framework answers (404, 405, validation) and unexpected exceptions included;
- `httpapi.docs`: the OpenAPI pages (Swagger UI, ReDoc) with their assets served locally.
"""
