"""Generate the Colab notebooks (book/*.ipynb) from the MyST chapters.

    python tools/notebooks.py           write book/NN_*.ipynb
    python tools/notebooks.py --check   exit 1 if any generated notebook is stale

Each generated notebook gets one extra first cell that installs the package
from the repository when (and only when) it runs in Colab, with its
dependencies pinned to the versions of requirements.txt (the ones the book is
tested with; jax with its CUDA build when the runtime has a GPU); the
repository URL is read from _config.yml, the one place it is written down.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jupytext
import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"


def repository_url():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    return config["repository"]["url"].rstrip("/")


def chapters():
    """The MyST notebooks under book/ (Markdown pages without a kernel are skipped)."""
    for path in sorted(BOOK.glob("*.md")):
        text = path.read_text()
        if text.startswith("---") and "format_name: myst" in text.split("---", 2)[1]:
            yield path


# The package's run-time dependencies, pinned in Colab as in requirements.txt.
COLAB_PINS = ("flax", "optax", "numpy", "scipy", "matplotlib", "seaborn", "celluloid",
              "pillow", "scikit-learn", "mlxtend")


def pins():
    """{name: version} of the exact pins in requirements.txt."""
    out = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[name.strip().lower()] = version.strip()
    return out


def install_cell(url):
    versions = pins()
    deps = " ".join(f"{name}=={versions[name]}" for name in COLAB_PINS)
    source = (
        "# Running in Colab? Install this book's package (annotated_s4) first, with the\n"
        "# dependency versions the book is tested with (JAX's CUDA build on a GPU runtime).\n"
        "import shutil, sys\n"
        "if \"google.colab\" in sys.modules:\n"
        f"    jax_pin = \"jax[cuda12]=={versions['jax']}\" if shutil.which(\"nvidia-smi\") "
        f"else \"jax=={versions['jax']}\"\n"
        f"    %pip install -q \"annotated-s4 @ git+{url}\" \"{{jax_pin}}\" {deps}"
    )
    return nbformat.v4.new_code_cell(source, metadata={"tags": ["remove-cell"]})


def render(path, url):
    nb = jupytext.read(path)
    nb.cells.insert(0, install_cell(url))
    # Stable cell ids, so that regenerating gives identical files.
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i}"
    return jupytext.writes(nb, fmt="ipynb")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a notebook is stale")
    args = parser.parse_args(argv)
    url = repository_url()
    stale = []
    for md in chapters():
        target = md.with_suffix(".ipynb")
        text = render(md, url)
        if args.check:
            if not target.exists() or target.read_text() != text:
                stale.append(target.relative_to(ROOT))
        else:
            target.write_text(text)
            print(f"wrote {target.relative_to(ROOT)}")
    if stale:
        print("stale generated notebooks (run `make notebooks`): " + ", ".join(map(str, stale)))
        return 1
    if args.check:
        print("generated notebooks are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
