"""The options of a ``daytona`` chain entry."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from providers.account import KeyedOptions

__all__ = ["API_KEY_ENV", "API_URL_ENV", "DaytonaOptions"]

API_KEY_ENV = "DAYTONA_API_KEY"
API_URL_ENV = "DAYTONA_API_URL"


class DaytonaOptions(KeyedOptions):
    """Options of a ``daytona`` chain entry.

    Attributes:
        api_key: the organization's API key; ``DAYTONA_API_KEY`` when unset.
        api_url: the API's URL (``DAYTONA_API_URL``, else Daytona's cloud).
        target: the region sandboxes are created in (``DAYTONA_TARGET``, else
            the organization's default).
        snapshot, image: what sandboxes start from when the spec names no
            template (at most one; Daytona's default snapshot when none).
        template_source: whether a spec's ``template`` names a snapshot or an
            image (a snapshot's id, as `DaytonaSandbox.snapshot` returns, names
            a snapshot either way).
        auto_stop_interval: minutes idle before Daytona stops a sandbox, when
            the spec names no ``idle_timeout`` (Daytona's default: 15; 0: never).
        auto_delete_interval: minutes after stopping before Daytona deletes a
            sandbox (0: at once, the default here; negative: never).
        auto_archive_interval: minutes stopped before Daytona archives it.
        request_timeout: seconds for each API request.
        transfer_timeout: seconds for one file upload or download.
        snapshot_timeout: seconds for a snapshot of a sandbox (Daytona commits
            its filesystem and pushes it to the organization's registry).
    """

    api_url: str | None = None
    target: str | None = None
    snapshot: str | None = None
    image: str | None = None
    template_source: Literal["snapshot", "image"] = "snapshot"
    auto_stop_interval: int | None = Field(default=None, ge=0)
    auto_delete_interval: int | None = 0
    auto_archive_interval: int | None = Field(default=None, ge=0)
    request_timeout: float = Field(default=30.0, gt=0)
    transfer_timeout: float = Field(default=300.0, gt=0)
    snapshot_timeout: float = Field(default=600.0, gt=0)

    @model_validator(mode="after")
    def _one_source(self) -> DaytonaOptions:
        if self.snapshot is not None and self.image is not None:
            raise ValueError("set at most one of snapshot and image")
        return self
