"""The router service: the process (`service.py`), its gRPC servicer (`servicer.py`) and OpenAI HTTP API
(`http.py`) over a shared front end (`frontend.py`), the round core's ZeroMQ shell (`loop.py`, `peers.py`), its
Prometheus metrics (`metrics.py`), the request journal in Redis (`journal.py`) and API keys (`auth.py`).
Nothing is imported here."""
