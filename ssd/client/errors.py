"""The SDK's typed errors: `SSDError` and one subclass per gRPC status a caller handles, and `to_error`, the one
place a grpc.RpcError becomes one of them."""
from __future__ import annotations

import grpc


class SSDError(Exception):
    """A failed call: `code` is the gRPC status name ("UNAVAILABLE", ...), `details` the server's message."""

    def __init__(self, code: str, details: str):
        super().__init__(f"{code}: {details}")
        self.code, self.details = code, details


class InvalidRequestError(SSDError):
    """INVALID_ARGUMENT: the request is malformed; `details` names the field."""


class UnavailableError(SSDError):
    """UNAVAILABLE: the router is starting or unreachable, or lost a worker mid-request."""


class DeadlineExceededError(SSDError):
    """DEADLINE_EXCEEDED: the call's timeout passed."""


class AuthenticationError(SSDError):
    """UNAUTHENTICATED: the API key is missing or unknown."""


class ResourceExhaustedError(SSDError):
    """RESOURCE_EXHAUSTED: the router is full or a limit was reached."""


_ERRORS = {grpc.StatusCode.INVALID_ARGUMENT: InvalidRequestError, grpc.StatusCode.UNAVAILABLE: UnavailableError,
           grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
           grpc.StatusCode.UNAUTHENTICATED: AuthenticationError,
           grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError}


def to_error(e: grpc.RpcError) -> SSDError:
    """The one place a gRPC failure becomes a typed SSDError."""
    code = e.code() if callable(getattr(e, "code", None)) else grpc.StatusCode.UNKNOWN
    details = e.details() if callable(getattr(e, "details", None)) else str(e)
    return _ERRORS.get(code, SSDError)(code.name, details or "")
