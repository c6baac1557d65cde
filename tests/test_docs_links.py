"""Every relative link in the README and in ``docs/`` resolves inside this repository.

A clone of the repository is all a reader has: a link to a file outside it (``../shared/...``), to a file that
was renamed, or to a heading that changed, is a dead end. Links inside code (fenced blocks, ``inline code``)
are not links and are skipped; web links (``http:``, ``https:``, ``mailto:``) are not checked here.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])

_FENCE = re.compile(r"^(```|~~~)")
_INLINE_CODE = re.compile(r"`[^`]*`")
_LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_EXTERNAL = ("http://", "https://", "mailto:")


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """The page's lines outside fenced code blocks, inline code blanked, with their 1-based numbers."""
    out: list[tuple[int, str]] = []
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, _INLINE_CODE.sub("``", line)))
    return out


def links(page: Path) -> list[tuple[int, str]]:
    """Every link target of ``page`` outside code: ``(line, target)``."""
    found: list[tuple[int, str]] = []
    for number, line in _prose_lines(page.read_text(encoding="utf-8")):
        found += [(number, m.group(1)) for m in _LINK.finditer(line)]
        ref = _REFERENCE.match(line)
        if ref:
            found.append((number, ref.group(1)))
    return found


def slug(heading: str) -> str:
    """The anchor a Markdown renderer (GitHub's rule) gives a heading: lower case, markup and punctuation
    removed but for ``-`` and ``_``, spaces turned into ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").replace("*", "").lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of ``page``'s headings (a repeated heading gets ``-1``, ``-2``, ... as a renderer does)."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for _, line in _prose_lines(page.read_text(encoding="utf-8")):
        m = _HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def problem(page: Path, target: str) -> str | None:
    """Why ``target``, a link on ``page``, does not resolve inside the repository; None when it does."""
    if target.startswith(_EXTERNAL):
        return None
    path_part, _, anchor = target.partition("#")
    resolved = (page.parent / path_part).resolve() if path_part else page
    if not resolved.is_relative_to(ROOT):
        return f"{target}: points outside the repository ({resolved})"
    if not resolved.exists():
        return f"{target}: no such file {resolved.relative_to(ROOT)}"
    if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
        return f"{target}: {resolved.relative_to(ROOT)} has no heading whose anchor is #{anchor}"
    return None


def test_the_pages_have_links_to_check() -> None:
    """The scan finds the links it is meant to check (a regex that matched nothing would pass everything)."""
    readme = [t for _, t in links(ROOT / "README.md")]
    assert "docs/definitions.md" in readme and "docs/conventions.md" in readme


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_inside_the_repository(page: Path) -> None:
    broken = [f"{page.relative_to(ROOT)}:{line}: {why}" for line, target in links(page)
              if (why := problem(page, target)) is not None]
    assert not broken, "\n".join(broken)


def test_a_broken_link_is_caught(tmp_path: Path) -> None:
    """The checker itself: a link outside the repository, a missing file, a missing heading, each named."""
    page = ROOT / "docs" / "conventions.md"
    assert problem(page, "../../shared/docs/definitions.md") is not None
    assert "no such file" in (problem(page, "nowhere.md") or "")
    assert "no heading" in (problem(page, "definitions.md#no-such-heading") or "")
    assert problem(page, "definitions.md#survivor-bias") is None
    assert problem(page, "#goodput") is None
    assert slug("The table, and how its definitions differ from vllm bench's") == (
        "the-table-and-how-its-definitions-differ-from-vllm-benchs")
    sample = tmp_path / "p.md"
    sample.write_text("see `[x](gone.md)` and\n```\n[y](gone.md)\n```\n[z](https://example.org)\n")
    assert links(sample) == [(5, "https://example.org")]
