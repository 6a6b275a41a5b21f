"""The book's own tooling: the notebook generator, the site checker, the configured versions."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import check_site  # noqa: E402
import notebooks  # noqa: E402


def test_generated_notebooks_have_install_cell_with_config_url():
    url = notebooks.repository_url()
    assert url.startswith("https://github.com/")
    chapters = list(notebooks.chapters())
    assert any(p.name == "01_ssm_basics.md" for p in chapters)
    assert not any(p.name in ("intro.md", "references.md") for p in chapters)
    text = notebooks.render(ROOT / "book" / "01_ssm_basics.md", url)
    assert f"git+{url}" in text and "google.colab" in text
    assert notebooks.render(ROOT / "book" / "01_ssm_basics.md", url) == text  # deterministic


def _site(tmp_path, body, extra=None):
    (tmp_path / "index.html").write_text(f"<html><body>{body}</body></html>")
    for name, content in (extra or {}).items():
        (tmp_path / name).write_text(content)
    return check_site.check(tmp_path, root=tmp_path / "repo")[0]


COLAB = "https://colab.research.google.com/github/org/repo/blob/main/"


@pytest.mark.parametrize("link,problem", [
    (COLAB + "book/01_a.ipynb", None),
    (COLAB + "book/01_a.md", "missing notebook"),
    (COLAB + "book/02_b.ipynb", "missing notebook"),
    ("https://example.org/", "no Colab link"),
])
def test_check_site_wants_a_colab_link_on_every_chapter(tmp_path, link, problem):
    repo = tmp_path / "repo"
    (repo / "book").mkdir(parents=True)
    (repo / "book" / "01_a.ipynb").write_text("{}")
    site = tmp_path / "site"
    (site / "book").mkdir(parents=True)
    (site / "index.html").write_text("<html></html>")
    (site / "book" / "01_a.html").write_text(f'<a href="{link}">Colab</a>')
    problems = check_site.check(site, root=repo)[0]
    assert len(problems) == (0 if problem is None else 1)
    assert problem is None or problem in problems[0]


def test_check_site_accepts_a_good_page(tmp_path):
    (tmp_path / "fig.png").write_bytes(b"png")
    assert _site(tmp_path, '<a href="other.html#sec">x</a><img src="fig.png">',
                 {"other.html": '<h1 id="sec">s</h1>'}) == []


@pytest.mark.parametrize("body,problem", [
    ('<img src="missing.png">', "missing image"),
    ('<a href="nowhere.html">x</a>', "broken link"),
    ('<a href="other.html#nope">x</a>', "missing anchor"),
    ("<pre>Traceback (most recent call last)</pre>", "Traceback"),
])
def test_check_site_finds_problems(tmp_path, body, problem):
    problems = _site(tmp_path, body, {"other.html": '<h1 id="sec">s</h1>'})
    assert len(problems) == 1 and problem in problems[0]


@pytest.mark.parametrize("body,raw", [
    ("<p>| data | layer | | --- | --- | | a | b |</p>", True),
    ("<p>|:---|---:|</p>", True),
    ("<table><tr><th>data</th><td>a</td></tr></table>", False),
    ("<pre>| --- | --- |</pre>", False),           # a table in a code block is code
    ("<p>a | b, and --- alone</p>", False),
])
def test_check_site_finds_raw_markdown_tables(tmp_path, body, raw):
    problems = _site(tmp_path, body)
    assert len(problems) == (1 if raw else 0)
    assert not raw or "raw text" in problems[0]


def test_show_links_to_the_configured_repository():
    from annotated_s4 import plotting

    assert plotting.REPOSITORY == notebooks.repository_url()


def test_python_version_is_stated_once_and_agrees():
    """pyproject, README and the CI workflow name the same Python (3.11)."""
    import re
    import tomllib

    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == ">=3.11"
    assert "Python 3.11" in (ROOT / "README.md").read_text()
    workflow = (ROOT / ".github" / "workflows" / "ci.yml").read_text()
    assert re.search(r"python-version:\s*[\"']?3\.11[\"']?", workflow)
    assert "bash .ci/run" in workflow


def test_colab_install_cell_pins_the_tested_versions():
    versions = notebooks.pins()
    source = notebooks.install_cell(notebooks.repository_url()).source
    for name in notebooks.COLAB_PINS + ("jax",):
        assert f"{name}=={versions[name]}" in source, name
