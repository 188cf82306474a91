"""The snapshots the emulated Daytona made of sandboxes, as its API shows them.

Their routes are `emulators.daytona.snapshot_api`. A snapshot of a sandbox
(``POST /api/sandbox/{id}/snapshot``, `SnapshotApi.snapshot`) is a copy of
the sandbox's directory in the local provider's snapshot store
(`providers.local.LocalSandbox.snapshot`), recorded as a `Captured` under
Daytona's id and its name, unique in its organization while the record lasts.
As on Daytona, the record is written ``active`` once the copy is made, before
the sandbox leaves ``snapshotting``; a delete marks it ``removing`` and it is
gone (its copy too) shortly after. A create naming it, by id or name, starts
from a copy of the copy. A snapshot made by ``POST /api/snapshots`` from an
image (a name, or a build) goes ``pending`` -> ``pulling`` (``building``) ->
``active``; nothing is pulled or built, and its sandboxes start from the
default files, with the sizes it was made with.

The deployment's general snapshots (`general`: the default snapshot and
those the emulator was given) are listed with them, to every organization,
and are read-only here: ``GET /api/snapshots`` pages both, newest first.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from emulators.daytona.sandboxes import iso

__all__ = ["Captured", "find", "general"]

_EPOCH = 1_735_689_600.0  # 2025-01-01, when the general snapshots were built


@dataclass
class Captured:
    """One snapshot made of a sandbox: its Daytona fields and the local copy it names."""

    id: str
    name: str
    organization_id: str
    local_id: str | None  # None: made from an image, its sandboxes start from the default files
    source_sandbox_id: str | None
    target: str
    cpu: int
    gpu: int
    memory: int
    disk: int
    state: str = "active"
    image_name: str | None = None
    build_info: dict[str, Any] | None = None
    entrypoint: list[str] | None = None
    error: str | None = None
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)

    def resources(self) -> dict[str, int]:
        """The sizes a sandbox made from it takes (the snapshotted sandbox's)."""
        return {"cpu": self.cpu, "gpu": self.gpu, "memory": self.memory, "disk": self.disk}

    def dto(self) -> dict[str, Any]:
        """The snapshot as the API shows it (``SnapshotDto``)."""
        return {
            "id": self.id,
            "organizationId": self.organization_id,
            "general": False,
            "name": self.name,
            "imageName": self.image_name,
            "state": self.state,
            "size": None,
            "entrypoint": self.entrypoint,
            "cpu": self.cpu,
            "gpu": self.gpu,
            "mem": self.memory,
            "disk": self.disk,
            "errorReason": self.error,
            "createdAt": iso(self.created),
            "updatedAt": iso(self.updated),
            "lastUsedAt": iso(self.created),
            "buildInfo": None
            if self.build_info is None
            else {
                **self.build_info,
                "createdAt": iso(self.created),
                "updatedAt": iso(self.created),
            },
            "regionIds": [self.target],
            "initialRunnerId": "emulated-runner",
            "ref": self.image_name or f"registry.emulated/daytona/{self.id}:latest",
            "sourceSandboxId": self.source_sandbox_id,
            "sandboxClass": "container",
        }


def find(captured: Iterable[Captured], id_or_name: str, organization_id: str) -> Captured | None:
    """The organization's snapshot with this id or name; an active one first, as Daytona picks."""
    mine = [
        snap
        for snap in captured
        if snap.organization_id == organization_id and id_or_name in (snap.id, snap.name)
    ]
    return next((snap for snap in mine if snap.state == "active"), mine[0] if mine else None)


def general(name: str) -> dict[str, Any]:
    """A general snapshot of the deployment (``SnapshotDto``), the same for every organization."""
    return {
        "id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"daytona-snapshot:{name}")),
        "organizationId": None,
        "general": True,
        "name": name,
        "imageName": name,
        "state": "active",
        "size": 1.0,
        "entrypoint": None,
        "cpu": 1,
        "gpu": 0,
        "mem": 1,
        "disk": 3,
        "errorReason": None,
        "createdAt": iso(_EPOCH),
        "updatedAt": iso(_EPOCH),
        "lastUsedAt": None,
        "buildInfo": None,
        "regionIds": ["us"],
        "initialRunnerId": None,
        "ref": name,
        "sourceSandboxId": None,
        "sandboxClass": "container",
    }
