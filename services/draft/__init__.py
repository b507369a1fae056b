"""The draft service: `service.py` (settings and the draft role the worker shell runs)."""
