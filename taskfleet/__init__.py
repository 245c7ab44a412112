"""taskfleet: serve a fleet of small, evaluated open models by task name."""

__version__ = "0.1.0"
