"""Speculative Speculative Decoding: serving system (router, target and draft services), engines and SDK."""

__version__ = "0.1.0"  # keep equal to pyproject.toml's version (tests/test_cli.py checks)
