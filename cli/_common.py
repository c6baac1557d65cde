"""What every command shares: the output consoles, the error exit, and SLO-threshold parsing."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape

from llmslo.telemetry import parse_duration

err = Console(stderr=True)
"""Standard error: progress, warnings, errors."""

PIPE_WIDTH = 200
"""Columns used for tables when standard output is not a terminal (pipes, CI logs)."""


def console() -> Console:
    """Standard output; wide enough for the tables when it is not a terminal."""
    out = Console()
    return out if out.is_terminal else Console(width=PIPE_WIDTH)


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print ``error: message`` on standard error and return the exit to raise (1: data, 2: usage)."""
    err.print(f"[bold red]error:[/bold red] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def duration(name: str, text: str) -> float:
    """Seconds from a ``--NAME`` duration option; a bad value exits with code 2 naming the option."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise fail(f"--{name}: {exc}", 2) from None


def threshold(name: str, text: str | None, default: float | None) -> float | None:
    """Seconds from a ``--NAME`` duration option; ``off``/``none``/``0`` disables it, absent gives ``default``."""
    if text is None:
        return default
    if text.strip().lower() in ("off", "none", "0"):
        return None
    return duration(name, text)
