"""Every relative link in README.md, docs/*.md and docs/experiments/*.md points to a file that exists, and to a
heading of it that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    *sorted((REPO / "docs" / "experiments").glob("*.md")),
]
# [text](target) and ![alt](target): the file up to a space, a `#` or a closing parenthesis, then the optional #anchor
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s#]*)(?:#([^)\s]*))?[^)]*\)")
# [name]: target, a reference-style link's definition
LINK_DEFINITION = re.compile(r"^\[[^\]]+\]:\s*([^\s#]*)(?:#(\S*))?", flags=re.MULTILINE)
CODE_BLOCK = re.compile(r"^```.*?^```", flags=re.DOTALL | re.MULTILINE)


def relative_links(page: Path) -> list[tuple[str, str]]:
    """(file, anchor) of each link that is not a URL; file is empty for an anchor of the page itself."""
    text = CODE_BLOCK.sub("", page.read_text(encoding="utf-8"))
    found = LINK.findall(text) + LINK_DEFINITION.findall(text)
    return [(target, anchor) for target, anchor in found if not re.match(r"[a-z]+:", target)]


def anchors(page: Path) -> set[str]:
    """The anchors a markdown renderer gives the page's headings: lower case, punctuation dropped, spaces as `-`."""
    found: set[str] = set()
    repeats: dict[str, int] = {}
    for heading in re.findall(r"^#+ (.+)$", CODE_BLOCK.sub("", page.read_text(encoding="utf-8")), flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(f"{slug}-{repeats[slug]}" if slug in repeats else slug)  # a repeated heading gets -1, -2, ...
        repeats[slug] = repeats.get(slug, 0) + 1
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_relative_links_resolve(page):
    broken = []
    for target, anchor in relative_links(page):
        linked = page.parent / target if target else page
        if not linked.exists() or (anchor and linked.suffix == ".md" and anchor not in anchors(linked)):
            broken.append(f"{target}#{anchor}" if anchor else target)
    assert not broken, f"{page.relative_to(REPO)} has broken links: {broken}"
