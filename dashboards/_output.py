"""Writing dashboards: every file complete or none changed."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

from llmslo.dashboards._dashboard import Dashboard
from llmslo.telemetry._files import create_temporary


def write_dashboards(dashboards: Sequence[Dashboard], directory: str | Path) -> list[Path]:
    """Write each dashboard to ``directory/<file_name>`` (the folder is created if missing); returns the paths.

    Each file is written to a temporary file in the same folder, flushed to disk, then renamed over its
    target, so a reader never sees a half-written dashboard and a failure leaves no temporary file behind.
    The files get the permissions of the user's umask (``0644`` under ``022``): Grafana's file provider,
    running as its own user, reads them.
    The renames happen once every file is written. Raises ``OSError`` (nothing renamed when writing fails;
    ``NotADirectoryError`` when ``directory`` is a file).
    """
    folder = Path(directory)
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"{folder} is a file; name a folder to write the dashboards into")
    folder.mkdir(parents=True, exist_ok=True)
    staged: list[tuple[Path, Path]] = []
    try:
        for dashboard in dashboards:
            fd, tmp = create_temporary(folder, f".{dashboard.file_name}.")
            staged.append((tmp, folder / dashboard.file_name))
            with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as out:
                out.write(dashboard.text())
                out.flush()
                os.fsync(out.fileno())
        for tmp, target in staged:
            os.replace(tmp, target)
    finally:
        for tmp, _ in staged:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    return [target for _, target in staged]
