"""Serving: gateway, Python runtime (the model library), placement publisher, client."""
