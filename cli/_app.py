"""The ``llmslo`` command group: every command listed in one static table, each imported when it runs.

``llmslo --help`` lists the commands from :data:`COMMANDS` (name and one-line help) without importing any
command module; a command's module is imported, and typer builds its options, only when that command (or
its ``--help``) runs. A sub-group (``gpu``, ``rules``, ``rollout``, ``drain``, ``dashboards``) is an entry
like any other: its module, with the commands in it, is imported when the sub-group runs. The table is the
one place where a command is registered; ``tests/test_cli_lazy.py`` checks it against the real commands.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer
import typer.core
import typer.main

from llmslo import __version__
from llmslo.cli._common import EXIT_STATUS_HELP

if TYPE_CHECKING:
    from typer._click import Command, Context, HelpFormatter
    from typer.core import MarkupMode

__all__ = ["COMMANDS", "CommandEntry", "LazyGroup", "app", "build_entry"]


@dataclass(frozen=True)
class CommandEntry:
    """One command of ``llmslo`` as the top-level help lists it, and where it lives."""

    name: str
    """The command's name on the command line (``stream-sim``)."""
    target: str
    """``module:attribute``: a command function, or a ``typer.Typer`` for a sub-group."""
    help: str
    """The one-line help ``llmslo --help`` shows: the first sentence of the command's help (shortened
    there to the terminal's width, as for any command)."""


COMMANDS: tuple[CommandEntry, ...] = (
    CommandEntry("ingest", "llmslo.cli._report:ingest",
                 "Validate request summaries and load them into the store (created if missing)."),
    CommandEntry("report", "llmslo.cli._report:report",
                 "Latency distributions, goodput, survivor bias and token figures per group."),
    CommandEntry("demo", "llmslo.cli._report:demo",
                 "Simulate a server through an overload burst, load the summaries into a fresh store, report."),
    CommandEntry("import", "llmslo.cli._import:import_command",
                 "Import other tools' benchmark results as request summaries, converted to llmslo's definitions."),
    CommandEntry("scrape", "llmslo.cli._scrape:scrape_command",
                 "Read /metrics expositions of vLLM, SGLang, TGI, llama.cpp, trtllm-serve, NIM or llmslo: concepts, "
                 "quantiles, SLO attainment, survivor bias."),
    CommandEntry("trace", "llmslo.cli._traces:trace_command",
                 "Read an Azure, Mooncake or BurstGPT trace as an arrival schedule and describe it as load."),
    CommandEntry("stream-sim", "llmslo.cli._telemetry:stream_sim_command",
                 "Simulate one request's bounded send queue tick by tick."),
    CommandEntry("anomalies", "llmslo.cli._anomalies:anomalies_command",
                 "Find windows whose latency distribution moved away from a baseline (docs/anomalies.md)."),
    CommandEntry("serve", "llmslo.cli._serve:serve_command",
                 "Run the reference OpenAI-compatible streaming server on a simulated engine."),
    CommandEntry("load", "llmslo.cli._load:load_command",
                 "Drive open-loop load against an OpenAI-compatible endpoint; report TTFT, TPOT, ITL and goodput."),
    CommandEntry("check", "llmslo.cli._check:check_command",
                 "Send one request and find it in the server's own llmslo metrics: does the server record requests?"),
    CommandEntry("app", "llmslo.cli._ui:app_command",
                 "Explore a store in the browser: a Streamlit app on http://127.0.0.1:PORT (Ctrl-C stops it)."),
    CommandEntry("gateway", "llmslo.cli._gateway:gateway_app",
                 "An OpenAI-compatible gateway in front of engines (llama.cpp, vLLM, SGLang, TGI, llmslo serve): token "
                 "budgets reserved at admission and settled from usage, a bounded priority queue with 429 + "
                 "Retry-After, a breaker per backend on stream health, least-loaded routing, streams passed on byte "
                 "for byte, one backend drained at a time, a request summary per request."),
    CommandEntry("gpu", "llmslo.cli._gpu:gpu_app",
                 "GPU samples: record (NVML), import (nvidia-smi, dmon, vLLM engine), correlate with request "
                 "latency."),
    CommandEntry("rules", "llmslo.cli._rules:rules_app",
                 "Prometheus recording and alert rules from an SLO spec (YAML, version: llmslo/v1): multi-window "
                 "multi-burn-rate alerts on goodput, TTFT/TPOT/e2e latency and errors, absent-data and "
                 "operational alerts, with promtool tests proving when each alert fires and resets."),
    CommandEntry("rollout", "llmslo.cli._rollout:rollout_app",
                 "Rolling updates, measured: keep a record of every update in the store (versions and artefact "
                 "checksums, request impact, metrics before/after, rollback, the drain's figures, batch "
                 "progress, the overlap window), list and show them, compare the versions during the overlap."),
    CommandEntry("drain", "llmslo.cli._drain:drain_app",
                 "Draining for rolling updates: the wait budget from the stored request durations and the "
                 "callers' timeout, and the check of a drain configuration against the rules of the update."),
    CommandEntry("dashboards", "llmslo.cli._dashboards:dashboards_app",
                 "Grafana dashboards for llmslo telemetry: a serving dashboard (requests and tokens, "
                 "TTFT/TPOT/ITL/e2e heatmaps and quantiles with request_id exemplars, queue against capacity, "
                 "rejections, breakers, drains, backpressure, GPUs) and an SLO dashboard (error budget left, "
                 "burn rates, alert state, from the recording rules of llmslo rules generate)."),
    CommandEntry("k8s", "llmslo.cli._k8s:k8s_app", "Kubernetes manifests behind llmslo gateway that drain right."),
    CommandEntry("autoscale", "llmslo.cli._autoscale:autoscale_app", "Simulate HPA autoscaling on a trace, by policy."),
)
"""Every command of ``llmslo``, in the order ``llmslo --help`` lists them."""


def build_entry(entry: CommandEntry, *, rich_markup_mode: MarkupMode = None, suggest_commands: bool = True) -> Command:
    """The click command of ``entry``, built by typer as ``app.command(name)`` or ``app.add_typer`` builds it.

    Imports the entry's module (which raises ``ModuleNotFoundError`` when an extra it needs is missing).
    """
    module, _, attribute = entry.target.partition(":")
    target = getattr(importlib.import_module(module), attribute)
    holder = typer.Typer(rich_markup_mode=rich_markup_mode, suggest_commands=suggest_commands, add_completion=False)
    if isinstance(target, typer.Typer):
        holder.add_typer(target, name=entry.name)
        return typer.main.get_group(holder).commands[entry.name]  # a group of one: the sub-group
    holder.command(entry.name)(target)
    return typer.main.get_command(holder)  # a Typer of one command is that command


class _Commands(MutableMapping[str, "Command"]):
    """A group's commands by name, from a table: each one built the first time it is asked for."""

    def __init__(self, entries: tuple[CommandEntry, ...], build: Callable[[CommandEntry], Command]) -> None:
        self._entries = {entry.name: entry for entry in entries}
        self._build = build
        self._built: dict[str, Command] = {}

    def __getitem__(self, name: str) -> Command:
        if name not in self._built:
            self._built[name] = self._build(self._entries[name])  # KeyError: no such command
        return self._built[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __setitem__(self, name: str, command: Command) -> None:
        raise TypeError(f"command {name!r}: register commands in llmslo.cli._app.COMMANDS, not on the group")

    def __delitem__(self, name: str) -> None:
        raise TypeError(f"command {name!r}: the commands of llmslo are those of llmslo.cli._app.COMMANDS")


class LazyGroup(typer.core.TyperGroup):
    """A typer group whose commands are those of :attr:`table`, each imported when it runs.

    Its help lists the table's names and one-line helps, so showing it imports no command module.
    """

    table: tuple[CommandEntry, ...] = ()
    """The commands, in the order the help lists them."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        if self.commands:  # a decorator on the group's Typer: a second way to register a command
            raise TypeError(f"commands {sorted(self.commands)} are registered on the group; list them in its table")
        self.commands = _Commands(self.table, self._build)

    def _build(self, entry: CommandEntry) -> Command:
        return build_entry(entry, rich_markup_mode=self.rich_markup_mode, suggest_commands=self.suggest_commands)

    def format_commands(self, ctx: Context, formatter: HelpFormatter) -> None:
        """The ``Commands:`` section, from the table: each help shortened as click shortens any command's."""
        if not self.table:
            return
        limit = formatter.width - 6 - max(len(entry.name) for entry in self.table)
        rows = [(entry.name, typer.core.TyperCommand(name=entry.name, help=entry.help).get_short_help_str(limit))
                for entry in self.table]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


class _LlmsloGroup(LazyGroup):
    table = COMMANDS


app = typer.Typer(
    name="llmslo",
    cls=_LlmsloGroup,
    help=(
        "Observability, SLOs and protection for LLM inference serving. One summary row per request, rejected, "
        "cancelled and failed ones included, measured inside a Python server (the middleware), in front of any "
        "engine (llmslo gateway: admission, token budgets, breakers, drains) or at the client (llmslo load); "
        "stored in DuckDB and reported as TTFT/TPOT/ITL distributions, goodput under a fixed policy, and "
        "whether success-only latency hides shed or cancelled requests (survivor bias); Prometheus rules and "
        "Grafana dashboards over llmslo's series or an engine's own.\n\n"
        "Start with: llmslo demo (a simulated server), or llmslo demo --engine llamacpp (a real llama.cpp "
        "server)"
    ),
    epilog=EXIT_STATUS_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        print(f"llmslo {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """Observability, SLOs and protection for LLM inference serving."""
