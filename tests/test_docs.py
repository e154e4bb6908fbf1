"""The README stays short and its links resolve; the docs name only results files that exist.

`mkdocs build --strict` (./scripts/test) checks the links between docs pages and into specs/
and bench/results/; these checks cover what it cannot see: the README, which is not part of
the site, and results files a page names in a code span or a table rather than a link.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"

# A markdown link's target: [text](target), up to a closing parenthesis or a space.
LINK = re.compile(r"\]\(([^)\s]+)\)")
# A results file as prose names it: bench/results/NAME.EXT, or a glob such as name-*.json.
RESULTS = re.compile(r"bench/results/[A-Za-z0-9_.*-]+\.(?:json|md|png)")


def _outside_fences(text: str) -> str:
    """The text without its fenced code blocks, where a path is a command's, not a link."""
    return re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)


def test_readme_is_at_most_300_lines() -> None:
    assert len(README.read_text().splitlines()) <= 300


def test_readme_links_resolve() -> None:
    targets = LINK.findall(_outside_fences(README.read_text()))
    assert any(t.startswith("docs/") for t in targets) and any(t.startswith("specs/") for t in targets)
    missing = []
    for target in targets:
        if re.match(r"[a-z]+:", target):
            continue  # a URL: nothing here to check offline
        path, _, anchor = target.partition("#")
        if path and not (ROOT / path).exists():
            missing.append(target)
    assert not missing, f"README links to files that do not exist: {missing}"


def test_readme_anchors_into_docs_exist() -> None:
    # mkdocs' heading ids, as the toc extension makes them for plain headings.
    def slug(heading: str) -> str:
        heading = re.sub(r"[`*\[\]()]", "", heading).strip().lower()
        return re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", heading))

    for target in LINK.findall(README.read_text()):
        path, _, anchor = target.partition("#")
        if anchor and path.startswith("docs/"):
            headings = re.findall(r"^#+ (.+)$", _outside_fences((ROOT / path).read_text()), flags=re.MULTILINE)
            assert anchor in {slug(h) for h in headings}, f"{target}: no such heading"


def test_every_docs_page_is_in_the_nav() -> None:
    config = (ROOT / "mkdocs.yml").read_text()
    # The specs are pages of the site too (docs/hooks.py adds them), listed under Protocol.
    pages = sorted([p.name for p in DOCS.glob("*.md")] + [f"specs/{p.name}" for p in (ROOT / "specs").glob("*.md")])
    assert pages, "docs/ holds no page"
    assert [p for p in pages if f": {p}" not in config] == []


def test_named_results_files_exist() -> None:
    missing = []
    for source in [README, *sorted(DOCS.glob("*.md"))]:
        for name in set(RESULTS.findall(source.read_text())):
            if not any(ROOT.glob(name)):
                missing.append(f"{source.relative_to(ROOT)}: {name}")
    assert not missing, missing
