"""mkdocs hooks: the protocol's specs and the benchmark results join the site from where they live.

`specs/` is the protocol's source of truth and `bench/results/` the benchmarks' record; neither
is copied into docs/. Each file is added to the build under its repository path (a page links
`specs/network.md` or `bench/results/zk.json` relative to docs/), so mkdocs checks every such
link like any other: one that names a missing file fails `mkdocs build --strict`.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure import pages as _pages
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
# Folders published as they are: their markdown renders as pages, the rest is served as files.
SHARED = ("specs", "bench/results")
# A spec's link to source code (`../vrl/rl/grpo.py`) names a file the site does not hold:
# shown as the path, not a link, so the spec reads as it does in the repository.
_SOURCE_LINK = re.compile(r"\[([^\]]+)\]\(\.\./((?:vrl|proofs|p2p|tests|scripts)/[^)\s]+)\)")


def _source_path(link: re.Match[str]) -> str:
    text, path = link.group(1), link.group(2)
    return text if text.strip("`") == path else f"{text} (`{path}`)"


def on_files(files: Files, config) -> Files:
    for folder in SHARED:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and not path.name.startswith("."):
                uri = path.relative_to(ROOT).as_posix()
                files.append(File(uri, str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files


# The code's docstrings cross-reference in Sphinx's roles (:class:`~vrl.tasks.Task`), which
# mkdocstrings renders as the role's name before the code: the API page shows the code alone.
_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj|const):(?=<code>)")
_TILDE = re.compile(r"<code>~")


def on_page_content(html: str, page, config, files) -> str:
    if page.file.src_uri == "api.md":
        return _TILDE.sub("<code>", _ROLE.sub("", html))
    return html


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri.startswith("specs/"):
        return _SOURCE_LINK.sub(_source_path, markdown)
    return markdown


# mkdocs scans each page's raw HTML for anchor ids with Python's HTMLParser, which on 3.11
# raises AssertionError at a `<![` that opens no CDATA section, even inside a code span (a
# regular expression's lookbehind in specs/rewards.md and specs/tasks.md). Markdown itself
# renders such a span fine, so the scan reads the three characters as text and goes on.
_Handler = getattr(_pages, "_HTMLHandler", None)
if _Handler is not None:
    _declaration = _Handler.parse_html_declaration

    def _tolerant_declaration(self, i: int) -> int:
        try:
            return _declaration(self, i)
        except AssertionError:
            self.handle_data(self.rawdata[i:i + 3])
            return i + 3

    _Handler.parse_html_declaration = _tolerant_declaration
