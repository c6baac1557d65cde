"""docs/engines.md: its tables are the profiles, rendered (``python -m llmslo.tests.test_engines_docs`` rewrites
them); the test fails when a profile changes and the page does not."""

from __future__ import annotations

import sys
from pathlib import Path

from llmslo.engines import EXTRA, EngineProfile, Series, all_profiles

DOC = Path(__file__).resolve().parents[1] / "docs" / "engines.md"
BEGIN = "<!-- profiles: generated from llmslo.engines; do not edit by hand -->"
END = "<!-- end of profiles -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _bounds(s: Series) -> str:
    if not s.buckets:
        return ""
    shown = [f"{b:.6g}" for b in s.buckets]
    return ", ".join(shown) if len(shown) <= 8 else f"{shown[0]}, {shown[1]} … {shown[-1]} ({len(shown)} bounds)"


def _concept(s: Series) -> str:
    if s.concept == EXTRA:
        return f"extra: {s.what}"
    if s.deprecated:
        return f"{s.concept} (older name)"
    return s.concept


def _difference(s: Series) -> str:
    parts = [s.difference] if s.difference else []
    if s.deprecated:
        parts.append(f"older name: {s.deprecated}")
    if s.high_water:
        parts.append("high-water mark: never a rate")
    if s.finish_label:
        values = f" ({', '.join(s.finish_values)})" if s.finish_values else ""
        parts.append(f"finish reason in `{s.finish_label}`{values}")
    return "; ".join(parts)


def render_profile(p: EngineProfile) -> str:
    lines = [f"### {p.name} (`{p.key}`, {p.version})", "",
             "| concept | series | type | unit | labels | buckets | difference | source |",
             "|---|---|---|---|---|---|---|---|"]
    for s in sorted(p.series, key=lambda s: (s.concept == EXTRA, s.concept, bool(s.deprecated), s.name)):
        labels = ", ".join(s.labels)
        lines.append("| " + " | ".join(_cell(x) for x in (
            _concept(s), f"`{s.name}`", s.type, s.unit, labels, _bounds(s), _difference(s), s.source)) + " |")
    lines += ["", "What it lacks:", ""]
    lines += [f"- `{c}`: {_cell(why)}" for c, why in p.lacks.items()]
    if p.notes:
        lines += ["", "Notes:", ""] + [f"- {_cell(n)}" for n in p.notes]
    return "\n".join(lines)


def render() -> str:
    return "\n\n".join(render_profile(p) for p in all_profiles())


def _generated(text: str) -> str:
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[start:end].strip()


def test_the_page_shows_the_profiles_as_they_are() -> None:
    assert _generated(DOC.read_text()) == render(), (
        "docs/engines.md is out of date: run python -m llmslo.tests.test_engines_docs")


def test_the_comparison_fails_when_a_profile_changes() -> None:
    import dataclasses

    first = all_profiles()[0]
    changed = dataclasses.replace(first, lacks={**first.lacks, "kv_usage": "said to be missing"})
    assert render_profile(changed) != render_profile(first)


def main() -> None:
    text = DOC.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    DOC.write_text(text[:start] + "\n\n" + render() + "\n\n" + text[end:])


if __name__ == "__main__":
    main()
    sys.exit(0)
