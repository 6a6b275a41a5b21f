"""Check the built site as a reader would meet it.

    python tools/check_site.py [_build/html]

Fails (exit 1) if any page shows a traceback or an error output, if an
image a page references does not exist, if an internal link points to a
page or anchor that does not exist, or if a chapter page (one built from a
notebook of book/) has no "open in Colab" link to a notebook that exists in
the repository, or if a page shows a Markdown table as raw text (a row such as
`| --- | --- |` outside a code block: a table that was not rendered).
"""

from __future__ import annotations

import re
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

ROOT = Path(__file__).resolve().parents[1]
COLAB = "colab.research.google.com/github/"

ERROR_MARKERS = (
    "Traceback (most recent call last)",
    "output_error",            # MyST-NB's class for error outputs
    "CellExecutionError",
)


# A Markdown table's delimiter row, e.g. "|---|:--:|" or "| --- | --- |".
RAW_TABLE_ROW = re.compile(r"\|\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)+\|?")


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids, self.links, self.images = set(), [], []
        self.text, self._in_code = [], 0   # visible text outside <pre>/<code>

    def handle_endtag(self, tag):
        if tag in ("pre", "code", "script", "style") and self._in_code:
            self._in_code -= 1

    def handle_data(self, data):
        if not self._in_code:
            self.text.append(data)

    def handle_starttag(self, tag, attrs):
        if tag in ("pre", "code", "script", "style"):
            self._in_code += 1
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])
        if tag == "img" and attrs.get("src"):
            self.images.append(attrs["src"])


def parse(path):
    page = _Page()
    page.feed(path.read_text(errors="replace"))
    return page


def colab_problems(rel, links, root=ROOT):
    """A chapter page must link to Colab, at a notebook of this repository.

    Colab links look like .../github/ORG/REPO/blob/BRANCH/PATH; PATH must be
    an .ipynb file that exists here (the generated notebook of the chapter).
    """
    targets = [href.split(COLAB, 1)[1] for href in links if COLAB in href]
    if not targets:
        return [f"{rel}: no Colab link"]
    problems = []
    for target in targets:
        parts = target.split("/", 4)  # ORG, REPO, "blob", BRANCH, PATH
        path = parts[4] if len(parts) == 5 and parts[2] == "blob" else ""
        if not path.endswith(".ipynb") or not (root / path).exists():
            problems.append(f"{rel}: Colab link to a missing notebook {target}")
    return problems


def chapter_pages(root=ROOT):
    """Pages built from the chapters that have a generated notebook (book/NN_*.ipynb)."""
    return {Path("book", p.with_suffix(".html").name) for p in (root / "book").glob("*.ipynb")}


def check(site, root=ROOT):
    site = Path(site)
    chapters = chapter_pages(root)
    pages = {p.resolve(): parse(p) for p in site.rglob("*.html")}
    problems = []
    for path, page in pages.items():
        rel = path.relative_to(site.resolve())
        if rel.parts[0] in ("_static", "genindex.html", "search.html"):
            continue
        text = path.read_text(errors="replace")
        if rel in chapters:
            problems += colab_problems(rel, page.links, root)
        for marker in ERROR_MARKERS:
            if marker in text:
                problems.append(f"{rel}: contains {marker!r}")
        raw = RAW_TABLE_ROW.search(" ".join(page.text))
        if raw:
            problems.append(f"{rel}: a Markdown table shown as raw text ({raw.group(0)!r})")
        for src in page.images:
            if src.startswith("data:") or urlparse(src).scheme:
                continue
            if not (path.parent / unquote(src.split("#")[0])).exists():
                problems.append(f"{rel}: missing image {src}")
        for href in page.links:
            url = urlparse(href)
            if url.scheme or href.startswith(("mailto:", "javascript:")):
                continue
            target = (path.parent / unquote(url.path)).resolve() if url.path else path
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                problems.append(f"{rel}: broken link {href}")
                continue
            if url.fragment and target in pages and url.fragment not in pages[target].ids:
                problems.append(f"{rel}: missing anchor {href}")
    return problems, len(pages)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    site = argv[0] if argv else "_build/html"
    if not Path(site, "index.html").exists():
        print(f"no built site at {site}")
        return 1
    problems, n = check(site)
    for problem in problems:
        print(problem)
    print(f"checked {n} pages: {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
