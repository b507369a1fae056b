"""The worker shell: what every worker process (target or draft) runs, whatever its role.

`service.py` holds the settings, process setup, control plane and serve loop; `io.py` the data-plane endpoint
(a ZeroMQ ROUTER socket); `metrics.py` the KV and prefix-cache numbers. The role's logic is its handler
(`ssd/engine/target_handler.py`, `ssd/engine/draft_handler.py`), given by the role's service as a `Role`;
nothing here imports target or draft code. Nothing is imported here, so the router can use `io` without torch.
"""
