"""The target service: `service.py` (settings and the target role the worker shell runs)."""
