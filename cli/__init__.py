"""The ``llmslo`` command line (needs the ``analysis`` extra).

Thin and lazy: ``llmslo --help`` lists the commands from one static table (``llmslo.cli._app.COMMANDS``)
and a command's module is imported only when that command runs; the command modules import the analysis
stack (duckdb, polars, pyarrow, scipy, numpy) inside the commands that use it, so ``llmslo --help``,
``llmslo --version`` and ``llmslo CMD --help`` load none of it. Exit status: 0 done, 1 an input is missing
or invalid, 2 the command line is wrong (see ``llmslo.cli._common``).
"""

from __future__ import annotations

__all__ = ["main"]


def main() -> None:
    """Entry point of the ``llmslo`` command."""
    try:
        from llmslo.cli._app import app

        app()
    except ModuleNotFoundError as exc:  # an extra is missing: say which, not a traceback
        if exc.name is None or exc.name.split(".")[0] == "llmslo":
            raise  # a module of llmslo itself: a bug, not a missing extra
        import sys

        sys.stderr.write(
            f"llmslo: the command line needs the 'analysis' extra ({exc.name} is not installed).\n"
            "Install it with: pip install 'llmslo[analysis]'\n"
        )
        raise SystemExit(1) from None  # 1: something the command needs is missing (llmslo.cli._common)
