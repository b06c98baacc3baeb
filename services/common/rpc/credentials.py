"""What this process sends on its outgoing gRPC calls to prove it belongs to the mesh.

Every service of a mesh shares one secret (setting `mesh_secret`); `run_service` installs it
once at start-up and `LazyStub` (services/common/rpc/client.py) adds it to every call as the
`x-starling-mesh-secret` metadata that `MeshSecretInterceptor` checks on the other side. It is
process-wide on purpose: a process belongs to one mesh, and the typed clients are built in many
places that should not each thread a secret through.
"""

from __future__ import annotations

MESH_METADATA_KEY = "x-starling-mesh-secret"

_metadata: tuple[tuple[str, str], ...] = ()


def set_mesh_secret(secret: str) -> None:
    """Send `secret` on every later outgoing call of this process (empty: send nothing)."""
    global _metadata
    _metadata = ((MESH_METADATA_KEY, secret),) if secret else ()


def mesh_metadata() -> tuple[tuple[str, str], ...]:
    return _metadata
