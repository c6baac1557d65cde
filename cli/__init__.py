"""The ``llmslo`` command line (needs the ``analysis`` extra)."""

from __future__ import annotations

__all__ = ["main"]


def main() -> None:
    """Entry point of the ``llmslo`` command."""
    try:
        from llmslo.cli._app import app
    except ModuleNotFoundError as exc:  # an extra is missing: say which, not a traceback
        import sys

        sys.stderr.write(
            f"llmslo: the command line needs the 'analysis' extra ({exc.name} is not installed).\n"
            "Install it with: pip install 'llmslo[analysis]'\n"
        )
        raise SystemExit(2) from None
    app()
