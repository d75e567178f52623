"""The ``[storage.local]`` keys: declared once, as the fields of ``LocalSettings``."""

from __future__ import annotations

import dataclasses

from rsm_sidecar.config import Settings, setting


@dataclasses.dataclass(frozen=True)
class LocalSettings(Settings):
    """Where the local backend keeps the objects, and how it writes them."""

    KEY_PREFIX = "storage.local"

    root: str | None = setting(
        "path", None, "Directory that holds the objects.", required_when=("storage.backend", "local")
    )
    fsync: bool = setting("bool", True, "fsync files and directories before a write is acknowledged.")
    file_mode: str = setting(
        "str",
        "0600",
        "Permissions of stored objects (octal); directories get the matching execute bits. The "
        "default keeps segments readable by the sidecar's user only, whatever the umask.",
        choices=("0600", "0640", "0644"),
    )


CONFIG_KEYS = LocalSettings.keys()
