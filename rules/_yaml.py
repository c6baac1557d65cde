"""YAML read with limits, so that a hostile or broken spec fails at once with a clear message.

PyYAML's safe loader shares the object of an anchor among its aliases, so ten lines of nested aliases
(a "billion laughs" file) load in milliseconds into a structure of millions of nodes; any walk over it (a
validation, an error message quoting it) then takes seconds to minutes and gigabytes. Nesting thousands
deep overflows the Python stack in PyYAML's recursive composer. :func:`load_yaml` therefore reads the
event stream first, which PyYAML produces without recursion and without expanding aliases, and refuses:

- more than :data:`MAX_YAML_NODES` nodes once every alias is expanded (aliases are allowed: a spec may
  share a selector or a list of alerts; a bomb may not);
- collections nested deeper than :data:`MAX_YAML_DEPTH`;
- an alias to its own enclosing node (a recursive structure), or to an anchor not defined before it.

Only then is the text loaded, with the same safe loader.
"""

from __future__ import annotations

from llmslo.rules._compat import yaml
from llmslo.rules._errors import SpecError

__all__ = ["MAX_YAML_DEPTH", "MAX_YAML_NODES", "check_shape", "load_yaml", "top_level_keys"]

MAX_YAML_NODES = 10_000
"""Most nodes (scalars, lists, mappings; mapping keys count) after alias expansion: the example spec has 94."""
MAX_YAML_DEPTH = 32
"""Deepest nesting of lists and mappings: a spec needs 5."""

_OPEN = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
_CLOSE = (yaml.MappingEndEvent, yaml.SequenceEndEvent)


def _where(event: yaml.Event) -> str:
    mark = event.start_mark
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "somewhere"


def check_shape(text: str, source: str) -> None:
    """Raise :class:`SpecError` if ``text`` expands past :data:`MAX_YAML_NODES`, nests past
    :data:`MAX_YAML_DEPTH`, or holds a recursive or undefined alias. Stops at the first excess."""
    expanded = 0  # nodes so far, every alias counted as the nodes it stands for
    open_starts: list[tuple[int, str | None]] = []  # per open collection: `expanded` at its start, its anchor
    sizes: dict[str, int] = {}  # anchor -> nodes it stands for
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent):
                name = event.anchor
                if name not in sizes:
                    why = ("refers to a node that contains it (a recursive structure)"
                           if any(a == name for _, a in open_starts) else "is not defined before it is used")
                    raise SpecError("", f"{source}: alias *{name} at {_where(event)} {why}")
                expanded += sizes[name]
            elif isinstance(event, yaml.ScalarEvent):
                expanded += 1
                if event.anchor is not None:
                    sizes[event.anchor] = 1
            elif isinstance(event, _OPEN):
                expanded += 1
                open_starts.append((expanded - 1, event.anchor))
                if len(open_starts) > MAX_YAML_DEPTH:
                    raise SpecError("", f"{source}: nested more than {MAX_YAML_DEPTH} levels deep at "
                                        f"{_where(event)}; an SLO spec needs 5")
            elif isinstance(event, _CLOSE):
                start, anchor = open_starts.pop()
                if anchor is not None:
                    sizes[anchor] = expanded - start
            else:
                continue
            if expanded > MAX_YAML_NODES:
                raise SpecError("", f"{source}: more than {MAX_YAML_NODES:,} YAML nodes once its aliases are "
                                    f"expanded (at {_where(event)}); an SLO spec needs a few hundred. "
                                    "Aliases (*name) may share a part of the spec, not multiply it")
    except yaml.YAMLError as exc:
        raise SpecError("", f"{source} is not valid YAML: {exc}") from None


def load_yaml(text: str, source: str = "spec") -> object:
    """The document in ``text`` (PyYAML's safe loader), once :func:`check_shape` has passed.

    ``source`` names the text in messages (a file name). Raises :class:`SpecError` for text beyond the
    limits or invalid YAML.
    """
    check_shape(text, source)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError("", f"{source} is not valid YAML: {exc}") from None


def top_level_keys(text: str, source: str = "file") -> list[str]:
    """The scalar keys of the top-level mapping of ``text`` (empty when it is not a mapping), in order.

    Read from the event stream, so no alias is expanded and no limit applies: enough to tell a rules file
    (``groups:``) from a promtool test file (``tests:``) before promtool reads it. Raises :class:`SpecError`
    for invalid YAML.
    """
    keys: list[str] = []
    depth = 0
    key_next = False  # at depth 1, whether the next node is a key
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, _OPEN):
                if depth == 0 and not isinstance(event, yaml.MappingStartEvent):
                    return keys
                if depth == 1:
                    key_next = not key_next
                depth += 1
                if depth == 1:
                    key_next = True
            elif isinstance(event, _CLOSE):
                depth -= 1
                if depth == 0:
                    return keys
            elif depth == 1 and isinstance(event, yaml.ScalarEvent | yaml.AliasEvent):
                if key_next and isinstance(event, yaml.ScalarEvent):
                    keys.append(event.value)
                key_next = not key_next
    except yaml.YAMLError as exc:
        raise SpecError("", f"{source} is not valid YAML: {exc}") from None
    return keys
