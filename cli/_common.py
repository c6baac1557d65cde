"""What every command shares: the output consoles, the error exit, and SLO-threshold parsing."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import typer

from llmslo.telemetry import parse_duration

if TYPE_CHECKING:
    from rich.console import Console

PIPE_WIDTH = 200
"""Columns used for tables when standard output is not a terminal (pipes, CI logs)."""


@functools.cache
def err() -> Console:
    """Standard error: progress, warnings, errors (made on first use: rich is not loaded for ``--help``)."""
    from rich.console import Console

    return Console(stderr=True)


def console() -> Console:
    """Standard output; wide enough for the tables when it is not a terminal."""
    from rich.console import Console

    out = Console()
    return out if out.is_terminal else Console(width=PIPE_WIDTH)


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print ``error: message`` on standard error and return the exit to raise (1: data, 2: usage)."""
    from rich.markup import escape

    err().print(f"[bold red]error:[/bold red] {escape(message)}", highlight=False, soft_wrap=True)
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
