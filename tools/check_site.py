"""Check the built site as a reader would meet it.

    python tools/check_site.py [_build/html]

Fails (exit 1) if any page shows a traceback or an error output, if an
image a page references does not exist, or if an internal link points to a
page or anchor that does not exist.
"""

from __future__ import annotations

import re
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

ERROR_MARKERS = (
    "Traceback (most recent call last)",
    "output_error",            # MyST-NB's class for error outputs
    "CellExecutionError",
)


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids, self.links, self.images = set(), [], []

    def handle_starttag(self, tag, attrs):
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


def check(site):
    site = Path(site)
    pages = {p.resolve(): parse(p) for p in site.rglob("*.html")}
    problems = []
    for path, page in pages.items():
        rel = path.relative_to(site.resolve())
        if rel.parts[0] in ("_static", "genindex.html", "search.html"):
            continue
        text = path.read_text(errors="replace")
        for marker in ERROR_MARKERS:
            if marker in text:
                problems.append(f"{rel}: contains {marker!r}")
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
