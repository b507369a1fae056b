#!/usr/bin/env python3
"""Container HEALTHCHECK: grpc.health.v1 Check on the service that runs as this container's main process.

The image runs any service by its command, so the port is found from that command: the role (`router`,
`target`, `draft`) and its `--grpc-address` / `--control-address` flag, else the `SSD_<ROLE>_*` environment
variable, else the service's default port. Exit 0 when SERVING; 1 otherwise. A main process that is not a
service (`ssd models prepare`, a shell) passes.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROLES = {"router": ("grpc_address", 50051), "target": ("control_address", 5701), "draft": ("control_address", 5702)}


def health_port(argv: list[str], env: dict) -> int | None:
    """The port to check for a main process started with `argv`, or None when it is not an ssd service."""
    role_at = next((i for i, a in enumerate(argv) if a in ROLES and i > 0 and Path(argv[i - 1]).name == "ssd"),
                   None)
    if role_at is None:
        return None
    role = argv[role_at]
    setting, port = ROLES[role]
    flag = "--" + setting.replace("_", "-")
    address = env.get(f"SSD_{role.upper()}_{setting.upper()}", "")
    rest = argv[role_at + 1:]
    for i, arg in enumerate(rest):
        if arg.startswith(flag + "="):
            address = arg.split("=", 1)[1]
        elif arg == flag and i + 1 < len(rest):
            address = rest[i + 1]
    return int(address.rpartition(":")[2]) if address else port


def main() -> int:
    try:
        argv = [a.decode() for a in Path("/proc/1/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        argv = []
    port = health_port(argv, dict(os.environ))
    if port is None:
        return 0
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=3)
        except grpc.RpcError as e:
            print(f"health check on port {port}: {e.code().name}", file=sys.stderr)
            return 1
    serving = reply.status == health_pb2.HealthCheckResponse.SERVING
    print(f"health check on port {port}: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}")
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main())
