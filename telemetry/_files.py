"""Output files written whole or not at all, with the permissions the user's umask gives.

:func:`create_temporary` makes the temporary file a writer fills before renaming it over its target (so a
reader never sees half a file). Unlike :func:`tempfile.mkstemp`, which always creates ``0600`` files, it asks
for ``0666`` and lets the process's umask take its part, as ``open()`` does: under umask ``022`` the file is
``0644``, readable by a Grafana, a Prometheus or a colleague running as another user. None of the files
llmslo writes holds a secret, so none is written ``0600`` (docs/conventions.md, "Files").
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

__all__ = ["create_temporary"]


def create_temporary(folder: str | os.PathLike[str], prefix: str, suffix: str = ".tmp") -> tuple[int, Path]:
    """A new file ``folder/<prefix><random><suffix>``, created exclusively with mode ``0666`` less the umask;
    returns its open descriptor (write only) and its path. Raises ``OSError`` when the folder cannot take it."""
    base = Path(folder)
    for _ in range(100):
        path = base / f"{prefix}{secrets.token_hex(6)}{suffix}"
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666), path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name for {prefix}…{suffix} in {base}")
