"""Output files written whole or not at all, with the permissions the user's umask gives.

:func:`create_temporary` makes the temporary file a writer fills before renaming it over its target (so a
reader never sees half a file). Unlike :func:`tempfile.mkstemp`, which always creates ``0600`` files, it asks
for ``0666`` and lets the process's umask take its part, as ``open()`` does: under umask ``022`` the file is
``0644``, readable by a Grafana, a Prometheus or a colleague running as another user. None of the files
llmslo writes holds a secret, so none is written ``0600`` (docs/conventions.md, "Files").
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from pathlib import Path

__all__ = ["create_temporary", "write_json_whole"]


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


def write_json_whole(path: str | os.PathLike[str], document: object) -> Path:
    """Write ``document`` as indented JSON to ``path``, whole or not at all: a temporary file beside it (the folder
    made where missing), renamed over it; the path. Raises ``OSError``."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = create_temporary(target.parent, f".{target.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(document, fh, indent=2)
            fh.write("\n")
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return target
