"""``llmslo stream-sim``: size a per-request send buffer with the deterministic tick simulator."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from llmslo.cli._common import EXIT_USAGE, shown
from llmslo.cli._common import fail as _fail
from llmslo.telemetry import LlmsloError


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated integers, got {text!r}") from None


def stream_sim_command(
    tokens: Annotated[int, typer.Option("--tokens", help="Output tokens the request generates.")] = 100,
    drain: Annotated[str, typer.Option(
        "--drain", help="Tokens the transport sends per tick: one integer, or a comma-separated list per tick "
        "(the last value repeats).")] = "1",
    capacity: Annotated[int | None, typer.Option(
        "--capacity", help="Send-queue capacity in tokens (default: unbounded).")] = None,
    deadline: Annotated[int | None, typer.Option(
        "--deadline", help="Tick at which the request ends with 'deadline' (default: none).")] = None,
    trace: Annotated[bool, typer.Option("--trace", help="Print the per-tick trace.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (for scripts).")] = False,
) -> None:
    """Simulate one request's bounded send queue tick by tick.

    Each tick: at the deadline tick the request ends (deadline); otherwise the transport sends up to the
    tick's drain from the queue, then the producer generates one token if tokens remain and the queue is
    below capacity, else the tick is paused. Reports sent, generated, unsent (backpressure waste), paused
    ticks and the deepest queue.
    """
    from rich.console import Console
    from rich.table import Table

    from llmslo.telemetry import simulate_stream

    drains = _ints(drain)
    try:
        result = simulate_stream(tokens, drains, capacity, deadline)
    except LlmsloError as exc:
        raise _fail(str(exc), EXIT_USAGE) from None
    if as_json:
        data = result.to_dict()
        if not trace:
            data.pop("trace")
        typer.echo(json.dumps(data, indent=2))
        return
    out = Console(width=120, emoji=False)
    t = Table(title="Stream simulation (tokens; ticks)", title_justify="left")
    for col in ("ticks", "generated", "sent", "unsent (waste)", "paused ticks", "deepest queue", "finish"):
        t.add_column(col, justify="right")
    t.add_row(str(result.ticks), str(result.generated), str(result.sent), str(result.unsent),
              str(result.paused_ticks), str(result.max_queued), shown(result.terminal.reason))
    out.print(t)
    if trace:
        tt = Table(title="Per tick", title_justify="left")
        for col in ("tick", "sent", "generated", "queued", "paused"):
            tt.add_column(col, justify="right")
        for s in result.trace:
            tt.add_row(str(s.tick), str(s.sent), str(s.generated), str(s.queued), "yes" if s.paused else "")
        out.print(tt)
