"""Tests for annotated_s4.plotting: source display, glue and the mass-spring animation."""

from pathlib import Path

import pytest

from annotated_s4 import discretize
from annotated_s4.plotting import mass_spring_animation, source

ROOT = Path(__file__).resolve().parents[1]


def test_source_is_the_package_code():
    text = source(discretize)
    assert text.startswith("def discretize(") and 'A: Num[Array, "N N"]' in text  # with its shapes
    assert "jnp.linalg.inv" in text
    with pytest.raises(TypeError, match="source"):
        source(3)


def test_animation_writes_a_gif(tmp_path):
    import numpy as np
    from PIL import Image

    t = np.linspace(0, 1, 20)
    path = mass_spring_animation(t, np.sin(t), np.cos(t), str(tmp_path / "a.gif"), frames=5)
    with Image.open(path) as im:
        assert im.format == "GIF" and im.n_frames == 5
    with pytest.raises(ValueError, match="frames"):
        mass_spring_animation(t, t, t, str(tmp_path / "b.gif"), frames=50)


def test_show_captions_the_source_file_and_line(monkeypatch):
    import IPython.display

    from annotated_s4 import plotting

    shown = []
    monkeypatch.setattr(IPython.display, "display", shown.append)
    plotting.show(discretize)
    text = shown[0].data
    path, first, last = plotting.source_location(discretize)
    assert path == "annotated_s4/ssm.py" and first < last
    lines = (ROOT / path).read_text().splitlines()
    assert lines[first - 1].startswith("def discretize(")
    assert text.startswith(f"[`annotated_s4/ssm.py:{first}`]({plotting.REPOSITORY}/blob/main/"
                           f"annotated_s4/ssm.py#L{first}-L{last})")
    assert "```python\ndef discretize(" in text


def test_glue_passes_numpy_scalars_as_python_numbers(monkeypatch):
    """myst-nb formats text/plain: np.float64(0.5) must reach it as 0.5. (Where
    myst-nb, the book's build tool, is not installed, as on a GPU machine that
    runs the tests only, there is no glue to check.)"""
    import numpy as np

    myst_nb = pytest.importorskip("myst_nb")

    from annotated_s4.plotting import glue

    seen = []
    monkeypatch.setattr(myst_nb, "glue", lambda name, value, display=True: seen.append(value))
    glue("a", np.float64(0.5), display=False)
    glue("b", "text", display=False)
    assert seen[0] == 0.5 and type(seen[0]) is float
    assert repr(seen[1]) == "text"   # a str shows as its text, without quotes


def test_block_diagram_draws_each_box_and_arrow():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from annotated_s4.plotting import block_diagram

    fig = block_diagram({"a": (0, 0, "in"), "b": (1, 0, "layer"), "c": (2, 0, "×")},
                        [("a", "b", (0.2, 0), (-0.3, 0), "x"), ("b", "c", (0.3, 0), (-0.1, 0))],
                        plain=("c",), xlim=(-1, 3), ylim=(-1, 1))
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert texts.count("in") == texts.count("layer") == texts.count("x") == 1
    assert len([c for c in ax.get_children() if type(c).__name__ == "Annotation"]) == 2
    framed = {t.get_text(): t.get_bbox_patch().get_edgecolor() for t in ax.texts if t.get_text() in ("layer", "×")}
    assert framed["×"][3] == 0 and framed["layer"][3] == 1      # no frame on a plain box
    assert ax.get_xlim() == (-1, 3)
    plt.close(fig)
