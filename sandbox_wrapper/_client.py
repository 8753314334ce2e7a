"""The one place that opens the run's gRPC channel and decodes the wire error model into reasons."""

from __future__ import annotations

from typing import Any

import grpc

from sandbox_wrapper._errors import HostUnavailableError

MAX_MESSAGE_BYTES = 8 * 2**20
"""Largest gRPC message this channel sends or accepts. It is not the binding limit: the host's run server
takes and sends at most 4 MiB a message, and each method caps its requests lower still."""

REASON_KEY = "agentnode-reason"


def open_channel(socket_path: str) -> Any:
    """Open an insecure channel to the run's Unix socket (the socket itself is the run's identity)."""
    return grpc.insecure_channel(
        f"unix:{socket_path}",
        options=[
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ],
    )


def refusal(err: Any) -> tuple[str, str]:
    """Return (reason, "<REASON>: message") for a failed RPC, so callers map reasons, never messages.

    An UNAVAILABLE status without a reason means the host itself is gone, which no agent can handle
    per call, so it raises HostUnavailableError. Any other status without a reason is a host fault.
    """
    reason = next((str(v) for k, v in (err.trailing_metadata() or ()) if k == REASON_KEY), "")
    details = str(err.details() or "")
    if reason in ("", "UNSPECIFIED"):
        if err.code() == grpc.StatusCode.UNAVAILABLE:
            raise HostUnavailableError(f"the agentnode host stopped answering: {details}") from err
        reason = "HOST_ERROR"
    message = details if details.startswith(f"{reason}:") else f"{reason}: {details}"
    return reason, message
