"""What this process sends on its outgoing gRPC calls to prove it belongs to the mesh.

Every service of a mesh shares one secret (setting `mesh_secret`); `run_service` installs it
once at start-up and `LazyStub` (services/common/rpc/client.py) adds it to every call as the
`x-starling-mesh-secret` metadata that `MeshSecretInterceptor` checks on the other side. It is
process-wide on purpose: a process belongs to one mesh, and the typed clients are built in many
places that should not each thread a secret through.
"""

from __future__ import annotations

MESH_METADATA_KEY = "x-starling-mesh-secret"
# A process that records its own admin changes in the audit log (the console) says so on its
# calls; services/common/rpc/audit.py then leaves them out (trusted with the mesh secret only).
AUDITED_BY_KEY = "x-starling-audited-by"

_metadata: tuple[tuple[str, str], ...] = ()
_audited_by: tuple[tuple[str, str], ...] = ()


def set_mesh_secret(secret: str) -> None:
    """Send `secret` on every later outgoing call of this process (empty: send nothing)."""
    global _metadata
    _metadata = ((MESH_METADATA_KEY, secret),) if secret else ()
    _metadata += _audited_by


def set_audited_by(name: str) -> None:
    """This process records the admin changes it makes itself (the console): every later
    outgoing call says so, and the audit interceptor does not record them a second time."""
    global _audited_by, _metadata
    _audited_by = ((AUDITED_BY_KEY, name),) if name else ()
    _metadata = tuple(kv for kv in _metadata if kv[0] != AUDITED_BY_KEY) + _audited_by


def mesh_metadata() -> tuple[tuple[str, str], ...]:
    return _metadata
