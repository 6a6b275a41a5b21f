"""The book's own tooling: the notebook generator, the site checker, the configured versions."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import check_site  # noqa: E402
import colab_run  # noqa: E402
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
    """pyproject, the Makefile, README and the CI workflow agree: Python 3.12
    and 3.13 are supported, CI runs the newest."""
    import re
    import tomllib

    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == ">=3.12"
    supported = re.search(r"^SUPPORTED_PYTHONS := (.*)$", (ROOT / "Makefile").read_text(),
                          re.M).group(1).split()
    assert supported == ["3.13", "3.12"]
    assert "Python 3.12 or 3.13" in (ROOT / "README.md").read_text()
    workflow = (ROOT / ".github" / "workflows" / "ci.yml").read_text()
    assert re.search(r"python-version:\s*[\"']?3\.13[\"']?", workflow)
    assert "bash .ci/run" in workflow


def test_colab_install_cell_pins_what_colab_has_not_imported():
    versions = notebooks.pins()
    source = notebooks.install_cell(notebooks.repository_url()).source
    # Exactly the tested versions of COLAB_PINS, but where Colab's numpy needs an
    # older one; jax on both branches (CPU, CUDA).
    expected = {n: notebooks.COLAB_VERSIONS.get(n, versions[n]) for n in notebooks.COLAB_PINS}
    assert colab_run.pinned(source) == {colab_run.canonical(n): v for n, v in expected.items()}
    assert set(notebooks.COLAB_VERSIONS) <= set(notebooks.COLAB_PINS)
    assert f'"jax[cuda12]" if shutil.which("nvidia-smi") else "jax"' in source
    # Nothing Colab's kernel has imported, nor what would bring them along, in any form.
    line = colab_run.pip_line(source)
    for name in colab_run.NEVER_PINNED:
        assert not re.search(rf"(^|[\s\"]){name}\s*(\[[^\]]*\])?\s*[=<>~!]", line, re.I), name
    assert set(colab_run.NEVER_PINNED) <= set(notebooks.COLAB_UNPINNED)
    # pip's output shown: Colab's restart prompt reads its "Successfully installed" line.
    assert not re.search(r"(^|\s)(-q+|--quiet)(\s|$)", line)
    assert "annotated-s4[book] @ git+" in line


def test_colab_run_pinned_reads_the_pins_of_a_pip_line():
    source = ('import shutil\nname = "jax[cuda12]" if shutil.which("nvidia-smi") else "jax"\n'
              '%pip install "pkg @ git+https://x/y" "{name}==1.2" Flax_Core==0.3 numpy')
    assert colab_run.pinned(source) == {"jax": "1.2", "flax-core": "0.3"}
    with pytest.raises(ValueError, match="one %pip line"):
        colab_run.pinned("print(1)")
    with pytest.raises(ValueError, match="does not set other"):
        colab_run.pinned('%pip install "{other}==1"')
    assert colab_run.expand(source, "if")[:3] == ["install", "pkg @ git+https://x/y",
                                                  "jax[cuda12]==1.2"]
    assert colab_run.expand(source, "else")[2] == "jax==1.2"


def test_colab_freeze_fixture_is_colabs_cpu_runtime():
    text = colab_run.FREEZE.read_text()
    assert colab_run.freeze_commit(text).startswith("a724079")
    versions = colab_run.parse_freeze(text)
    # The versions Colab's runtime of that commit has (backend-info's pip-freeze.txt).
    for name, version in {"numpy": "2.1.3", "matplotlib": "3.10.0", "pillow": "11.3.0",
                          "pandas": "2.2.3", "mlxtend": "0.23.4", "jax": "0.7.2",
                          "jaxlib": "0.7.2", "flax": "0.11.2", "optax": "0.2.8",
                          "ipykernel": "6.17.1", "ipython": "7.34.0", "pip": "24.1.2"}.items():
        assert versions[name] == version, name
    gpu = colab_run.FREEZE.with_name("colab_freeze.gpu.txt").read_text()
    assert colab_run.freeze_commit(gpu) == colab_run.freeze_commit(text)
    cuda = colab_run.parse_freeze(gpu)
    assert cuda["jax-cuda12-plugin"] == cuda["jax-cuda12-pjrt"] == "0.7.2"
    assert cuda["nvidia-cuda-runtime-cu12"].startswith("12.8.")
    assert colab_run.parse_freeze("# c\nScikit_Learn==1.6.1\n\n") == {"scikit-learn": "1.6.1"}
    with pytest.raises(ValueError, match="line 2"):
        colab_run.parse_freeze("numpy==2.1.3\ngoogle-colab @ file:///colabtools/dist/x.tar.gz\n")
    with pytest.raises(ValueError, match="commit"):
        colab_run.freeze_commit("numpy==2.1.3\n")


def test_colab_run_installs_this_checkout_instead_of_github():
    url = notebooks.repository_url()
    source = notebooks.install_cell(url).source
    local = colab_run.substitute_repository(source, url, ROOT)
    assert f"git+{ROOT.resolve().as_uri()}\"" in local and url not in local
    assert colab_run.pinned(local) == colab_run.pinned(source)
    with pytest.raises(ValueError, match="does not install from"):
        colab_run.substitute_repository(source, "https://github.com/other/repo", ROOT)


def test_colab_runtime_env_reads_the_package_index_only(tmp_path):
    environ = {"PATH": "/usr/bin", "PIP_FIND_LINKS": "/opt/wheels", "PIP_CONSTRAINT": "c.txt",
               "PIP_EXTRA_INDEX_URL": "file:///opt/pypi", "PYTHONPATH": "/work", "HOME": "/root",
               "PIP_CERT": "/etc/ssl/ca.crt", "JAX_COMPILATION_CACHE_DIR": "/tmp/j"}
    env = colab_run.runtime_env(environ, tmp_path / "home", tmp_path / "venv")
    assert env["HOME"] == str(tmp_path / "home")
    assert env["PATH"].split(":")[0] == str(tmp_path / "venv" / "bin")
    assert env["PIP_CONFIG_FILE"] == os.devnull and env["PIP_CERT"] == "/etc/ssl/ca.crt"
    for name in ("PIP_FIND_LINKS", "PIP_CONSTRAINT", "PIP_EXTRA_INDEX_URL", "PYTHONPATH",
                 "JAX_COMPILATION_CACHE_DIR"):
        assert name not in env


def test_colab_run_finds_the_restart_prompt():
    prompt = {"output_type": "display_data", "metadata": {},
              "data": {colab_run.RESTART: {"pip_warning": {"packages": ["numpy"]}, "id": "x"}}}
    cells = [{"outputs": [{"output_type": "stream", "text": "Successfully installed numpy-2"}]},
             {"outputs": [prompt]}, {"source": "x = 1"}]
    assert colab_run.restart_prompts(cells) == [["numpy"]]
    assert colab_run.restart_prompts(cells[:1]) == []


# The browser check (tools/check_browser.py) on hand-made pages: one good page,
# and one page per defect, each of which must be found.
_NAV = """
<style>
  .bd-sidebar-primary { width: 250px; }
  @media (max-width: 991px) { .bd-sidebar-primary { display: none; position: fixed; top: 0; left: 0;
                                                   height: 100%; background: white; }
                              .bd-sidebar-primary.open { display: block; } }
  @media (min-width: 992px) { .bd-sidebar-primary.closed { display: none; } }
</style>
<div class="bd-sidebar-primary">Contents</div>
<button class="primary-toggle" style="width:40px;height:40px"
  onclick="const s = document.querySelector('.bd-sidebar-primary');
           s.classList.toggle(innerWidth < 992 ? 'open' : 'closed')">=</button>
"""
_DEAD_NAV = _NAV.replace("onclick=", "data-onclick=")
_PAGES = {
    "good": ("<p>Text with a formula, shown by MathJax.</p><table><tr><td>1</td></tr></table>"
             '<div class="highlight"><pre>def f(x):\n    return x</pre></div>'
             '<div class="cell_output"><div class="output stream"><pre>a\nb</pre></div></div>'),
    "MathJax error": '<p><mjx-container><mjx-merror data-mjx-error="Undefined control sequence \\foo">'
                     "\\foo</mjx-merror></mjx-container></p>",
    "raw TeX in text": "<p>where \\lVert x \\rVert is the norm</p>",
    "display equation clipped": ('<div class="math" style="overflow: hidden; width: 300px">'
                                 '<mjx-container display="true" style="display: block">'
                                 '<span style="display: inline-block; width: 1200px">x</span>'
                                 "</mjx-container></div>"),
    "image not loaded": '<img src="missing.png">',
    "listing wraps its lines": ('<div class="highlight"><pre style="white-space: pre-wrap">'
                                "def f(x):\n    return x</pre></div>"),
    "printed output split into boxes": ('<div class="cell_output"><div class="output stream">'
                                        '<pre>line 1</pre></div><div class="output stream">'
                                        "<pre>line 2</pre></div></div>"),
    "table printed as text": ('<div class="cell_output"><div class="output stream"><pre>'
                              "model | params | error\n------+--------+------\n"
                              "S4    | 10     | 0.1\n</pre></div></div>"),
    "script error": "<script>const x = 1;</script><script>const x = 2;</script>",
    "navigation": "",
    "figure text too small": '<img src="wide.png" style="width: 600px">',
}


@pytest.mark.skipif(not any(map(__import__("shutil").which, ("chromium", "chromium-browser"))),
                    reason="needs Chromium (make book installs it)")
def test_check_browser_finds_each_defect(tmp_path):
    import asyncio

    import check_browser

    from PIL import Image

    Image.new("RGB", (2000, 100), "white").save(tmp_path / "wide.png", dpi=(100, 100))
    for name, body in _PAGES.items():
        nav = _DEAD_NAV if name == "navigation" else _NAV
        page = f"<html><body>{nav}<article>{body}</article></body></html>"
        (tmp_path / (name.replace(" ", "_") + ".html")).write_text(page)
    problems = asyncio.run(check_browser.check(tmp_path, widths=(1280, 390), log=lambda *a: None))
    for name in _PAGES:
        page = name.replace(" ", "_") + ".html"
        found = problems.get((page, 390), []) + problems.get((page, 1280), [])
        if name == "good":
            assert found == []
        else:
            assert found and all(d.startswith(name) for d in found), (name, found)


def test_the_failure_log_plugin_writes_each_failure_as_it_happens(tmp_path):
    """tools/pytest_failures.py (what tools/gpu_test.sh runs with): the failing
    test's traceback, and nothing of the passing one, reach the file, with
    pytest-xdist's workers too."""
    (tmp_path / "test_two.py").write_text(
        "def test_passes():\n    assert True\n\n"
        "def test_fails():\n    assert 1 + 1 == 3, 'arithmetic'\n")
    log = tmp_path / "failures.txt"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tools")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "pytest_failures",
         "--failures-file", str(log), "-n", "2", str(tmp_path / "test_two.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 1, done.stdout + done.stderr
    text = log.read_text()
    assert text.count("test_two.py::test_fails (call)") == 1 and "arithmetic" in text
    assert "test_passes" not in text


def test_colab_run_seeds_the_download_cache_with_the_checked_results(tmp_path, monkeypatch):
    """The emulated Colab runtime finds every committed benchmark result in its
    download cache, and runs.locate_result, with no repository beside it,
    accepts each against the package's manifest."""
    from annotated_s4 import runs

    n = colab_run.seed_benchmark_results(tmp_path)
    with open(runs.RESULTS_MANIFEST) as f:
        names = list(json.load(f))
    assert n == len(names) > 0
    monkeypatch.setenv("ANNOTATED_S4_CACHE", str(tmp_path))
    for name in names:
        found = runs.locate_result(name, root=str(tmp_path / "no-repository"), url="file:///nowhere/")
        assert found == str(tmp_path / "benchmark_results" / name)
