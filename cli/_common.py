"""What every command shares: the output consoles, data shown literally, the error exit, SLO thresholds, and the
arguments of the commands that send requests to a server (``load``, ``check``).

Exit status, the same for every command:

- ``0``: done.
- ``1`` (:data:`EXIT_INPUT`): the command line is fine but what it names is not: a file that is missing,
  unreadable or invalid (a row, an SLO spec, an exposition, a trace), a store that is missing or of
  another kind, a tool or extra that is not installed (promtool, the analysis extra), promtool rejecting
  rules, nothing to report.
- ``2`` (:data:`EXIT_USAGE`): the command line itself is wrong, whatever the files hold: an unknown option
  or a missing argument, a bad option value (a duration, a threshold, a kind, a column), options that
  cannot go together.

Data shown to a person goes through :func:`shown` first: a label value of ``[link=…]`` or ``\\x1b[2J`` is
printed as those characters, never as rich markup, an emoji, or a terminal escape.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated

import typer

from llmslo.telemetry import parse_duration

if TYPE_CHECKING:
    from pathlib import Path

    from rich.console import Console

    from llmslo.rules import Model

ServerUrl = Annotated[str, typer.Argument(help="The server: http://HOST:PORT, .../v1, or the endpoint's own URL.",
                                          show_default=False, metavar="URL")]
"""The server a command sends requests to."""
ModelOption = Annotated[str | None, typer.Option("--model", help="Model to ask for (default: the first the server "
                                                 "lists at /v1/models).")]
ApiKeyOption = Annotated[str | None, typer.Option("--api-key", envvar="LLMSLO_API_KEY",
                                                  help="Sent as Authorization: Bearer KEY.")]

EXIT_INPUT = 1
"""Exit status when an input (file, store, tool) is missing or invalid."""
EXIT_USAGE = 2
"""Exit status when the command line itself is wrong."""

EXIT_STATUS_HELP = (
    "Exit status: 0 done; 1 an input is missing or invalid (a file, its rows, an SLO spec, the store, "
    "promtool or an extra not installed); 2 the command line is wrong (an unknown option, a bad value "
    "such as a duration or a threshold, options that cannot go together)."
)
"""The exit-status convention, as the top-level ``--help`` prints it."""

OFF = "off"
"""The one spelling that switches an SLO threshold off."""

PIPE_WIDTH = 200
"""Columns used for tables when standard output is not a terminal (pipes, CI logs)."""

# C0 and C1 control characters, DEL, and the invisible characters that move or reorder text (zero-width
# spaces and joiners, bidirectional marks, embeddings, overrides and isolates, line and paragraph
# separators, the byte-order mark): each could hide or fake what a terminal shows.
_INVISIBLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
_INVISIBLE_BUT_NEWLINE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


def _escape_code(match: re.Match[str]) -> str:
    """``\\x1b`` for ESC, ``\\x09`` for TAB, ``\\u202e`` for RIGHT-TO-LEFT OVERRIDE: its code point, visible."""
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


# What rich reads as a markup tag: "[" then a lower-case letter, "#", "/" or "@", up to the next "]",
# after any backslashes (which rich reads in pairs, an odd one escaping the tag).
_TAG = re.compile(r"(\\*)(\[[a-z#/@][^[]*?])")


def _escape_tag(match: re.Match[str]) -> str:
    backslashes, tag = match.groups()
    return f"{backslashes}{backslashes}\\{tag}"


def shown(value: object, *, newlines: bool = False) -> str:
    """``str(value)`` as rich markup that prints it literally, character for character.

    Markup is escaped (``[bold]`` prints as ``[bold]``, ``[link=…]`` makes no hyperlink), and control and
    invisible characters are written as their code points (ESC as ``\\x1b``, TAB as ``\\x09``, U+202E as
    ``\\u202e``), so that no escape sequence reaches the terminal. With ``newlines``, a line feed stays a
    line break (messages of several lines). The result may be embedded in other markup
    (``f"[dim]{shown(x)}[/dim]"``): a trailing backslash is closed off so that it cannot escape the tag
    that follows. Emoji codes such as ``:smile:`` stay as written because :func:`console` and :func:`err`
    turn emoji replacement off: print through them, not through a bare ``Console``.
    """
    pattern = _INVISIBLE_BUT_NEWLINE if newlines else _INVISIBLE
    text = _TAG.sub(_escape_tag, pattern.sub(_escape_code, str(value)))
    trailing = len(text) - len(text.rstrip("\\"))
    if trailing:  # rich reads backslashes before a "[" in pairs: double them, then give them a tag to precede
        text += "\\" * trailing + "[default][/default]"
    return text


@functools.cache
def err() -> Console:
    """Standard error: progress, warnings, errors (made on first use: rich is not loaded for ``--help``)."""
    from rich.console import Console

    return Console(stderr=True, emoji=False)


def console() -> Console:
    """Standard output; wide enough for the tables when it is not a terminal. Emoji codes are not replaced."""
    from rich.console import Console

    out = Console(emoji=False)
    return out if out.is_terminal else Console(width=PIPE_WIDTH, emoji=False)


def say_on_stderr(line: str) -> None:
    """Print one progress line of a running server on standard error; a line that cannot be written (standard
    error closed: a broken pipe) is dropped, so that nothing a server still has to do (a drain) stops for it."""
    with contextlib.suppress(OSError):
        print(line, file=sys.stderr, flush=True)


def fail(message: str, code: int = EXIT_INPUT) -> typer.Exit:
    """Print ``error: message`` (shown literally) on standard error; return the exit to raise.

    ``code`` follows the module's convention: :data:`EXIT_INPUT` (1) for inputs, :data:`EXIT_USAGE` (2) for
    the command line.
    """
    err().print(f"[bold red]error:[/bold red] {shown(message, newlines=True)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def duration(name: str, text: str) -> float:
    """Seconds (> 0, finite) from a ``--NAME`` duration option; a bad value exits 2 naming the option."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise fail(f"--{name}: {exc}", EXIT_USAGE) from None


def threshold(name: str, text: str | None, default: float | None) -> float | None:
    """Seconds from a ``--NAME`` SLO threshold: absent gives ``default``, ``off`` switches the SLO off.

    Any other value must be a positive duration with a unit (``500ms``, ``2s``); ``0``, ``0s``, ``-1``,
    ``nan``, ``inf``, ``1e309`` and a bare ``2`` exit 2 with a message naming ``--NAME`` and saying how
    to switch the SLO off. Every command that takes a threshold reads it here.
    """
    if text is None:
        return default
    if text.strip().lower() == OFF:
        return None
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise fail(f"--{name}: {exc}; to switch this SLO off, write --{name} {OFF}", EXIT_USAGE) from None


def parse_time(option: str, text: str) -> float:
    """Unix seconds from ``--OPTION``: a number of Unix seconds or an ISO 8601 time (UTC when it names no
    offset); a bad value exits 2 naming the option."""
    try:
        value = float(text)
    except ValueError:
        try:
            when = datetime.fromisoformat(text.strip())
        except ValueError:
            raise fail(f"--{option}: {text!r} is neither Unix seconds nor an ISO 8601 time "
                       "(e.g. 1767225600 or 2026-01-01T00:00:00Z)", EXIT_USAGE) from None
        return (when if when.tzinfo is not None else when.replace(tzinfo=UTC)).timestamp()
    if not math.isfinite(value):
        raise fail(f"--{option}: must be a finite number of Unix seconds, got {text!r}", EXIT_USAGE)
    return value


def spec_model(spec: Path, engine: str | None = None) -> Model:
    """The model of the SLO spec file ``spec`` (over inference ``engine``'s own series when given); an
    unreadable or invalid spec exits 1 naming it (and the field), as does a spec of which no objective can be
    computed from the engine's series (each refusal with its reason and way out); an unknown engine exits 2."""
    from llmslo.engines import ENGINES
    from llmslo.rules import EngineSupportError, SpecError, build_model, load_spec

    if engine is not None and engine not in ENGINES:
        raise fail(f"--engine: unknown engine {engine!r}; known engines: {', '.join(ENGINES)}", EXIT_USAGE)
    try:
        return build_model(load_spec(spec, engine=engine is not None), engine)
    except EngineSupportError as exc:
        raise fail(f"{spec}: {exc}", EXIT_INPUT) from None
    except SpecError as exc:  # a field's error names the field; one about the whole file names the file
        raise fail(f"{spec}: {exc}" if exc.path else str(exc), EXIT_INPUT) from None
    except OSError as exc:
        raise fail(f"cannot read {spec}: {exc.strerror or exc}", EXIT_INPUT) from None


def print_refusals(model: Model) -> None:
    """On standard error, each spec entry left out of rules over an engine's own series, with why and the
    way out: objectives ``refused``, operational alerts ``not generated``."""
    for r in model.refused:
        what = "refused" if r.path.startswith("objectives") else "not generated"
        err().print(f"[yellow]{what}:[/yellow] {shown(r.message())}", highlight=False, soft_wrap=True)


def refusals_json(model: Model) -> list[dict[str, str]]:
    """The refusals of :func:`print_refusals` for ``--json``."""
    return [{"path": r.path, "entry": r.entry, "engine": r.engine, "reason": r.reason, "way_out": r.fix}
            for r in model.refused]
