"""Ways to reach an HAProxy node: push config sets, reload, talk to its sockets."""

from __future__ import annotations

from apps.fleets.node.transports.base import (
    ConfigBundleLike,
    HostKeyMismatch,
    NodeConn,
    PushResult,
    Transport,
    TransportError,
)


def transport_for(node: NodeConn) -> Transport:
    """The transport a node's settings ask for (SSH is imported lazily: asyncssh is heavy)."""
    if node.transport == "local":
        from apps.fleets.node.transports.local import LocalTransport

        return LocalTransport(node)
    if node.transport == "ssh":
        from apps.fleets.node.transports.ssh import SshTransport

        return SshTransport(node)
    raise ValueError(f"unknown transport {node.transport!r}")


__all__ = [
    "ConfigBundleLike",
    "HostKeyMismatch",
    "NodeConn",
    "PushResult",
    "Transport",
    "TransportError",
    "transport_for",
]
