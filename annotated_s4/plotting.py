"""Display helpers and figures used by the chapters.

`show(obj)` prints the package's own source for a function or class, so the
code a reader sees in the book is exactly the code that runs, under a caption
that names its file and line and links to it in the repository.
"""

from __future__ import annotations

import inspect
import textwrap

__all__ = ["show", "glue", "source", "source_location", "block_diagram", "mass_spring_animation"]

# The repository the book is published from; tests/test_tools.py checks that it
# is the `repository` of _config.yml (which the launch buttons read).
REPOSITORY = "https://github.com/annotated-s4/annotated-s4-book"
BRANCH = "main"


def glue(name, value, display=True):
    """myst-nb's `glue`, for the {glue:text} roles of a page's prose.

    NumPy scalars are glued as the Python numbers they hold (myst-nb formats
    text/plain, where np.float64(0.5) is not a number), and a str as its
    text, without the quotes of its repr. Outside a book build
    (Colab, plain Jupyter without myst-nb) it does nothing: glue only feeds
    the page's text.
    """
    try:
        from myst_nb import glue as myst_glue
    except ImportError:
        return
    import numpy as np

    if isinstance(value, np.generic):
        value = value.item()
    elif isinstance(value, str):
        value = _Text(value)
    myst_glue(name, value, display=display)


class _Text:
    """A string whose text/plain form is the string itself."""

    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return self.text


def source(obj, dedent=True):
    """The source text of a function, class or method of this package."""
    try:
        text = inspect.getsource(obj)
    except (TypeError, OSError) as err:
        raise TypeError(f"cannot show the source of {obj!r}: {err}") from None
    return textwrap.dedent(text) if dedent else text


def source_location(obj):
    """(path, first line, last line) of `obj`'s source, the path relative to the
    repository root, e.g. ("annotated_s4/ssm.py", 66, 77)."""
    obj = inspect.unwrap(getattr(obj, "__wrapped__", obj))
    try:
        lines, first = inspect.getsourcelines(obj)
    except (TypeError, OSError) as err:
        raise TypeError(f"cannot show the source of {obj!r}: {err}") from None
    module = inspect.getmodule(obj).__name__
    return module.replace(".", "/") + ".py", first, first + len(lines) - 1


def show(*objs):
    """Display the source of one or more objects as a highlighted Python block.

    In a notebook (and in the built book) this renders as Markdown: a caption
    with the file and line, linked to the source in the repository, then a
    fenced ``python`` code block, highlighted by the book's theme.
    """
    from IPython.display import Markdown, display

    for obj in objs:
        path, first, last = source_location(obj)
        link = f"{REPOSITORY}/blob/{BRANCH}/{path}#L{first}-L{last}"
        caption = f"[`{path}:{first}`]({link})"
        display(Markdown(caption + "\n\n```python\n" + source(obj).rstrip() + "\n```"))


def block_diagram(boxes, arrows, *, plain=(), xlim, ylim, figsize=(8, 3.0), fontsize=9):
    """A block's data flow: labelled boxes joined by arrows, on a new figure.

    boxes: {name: (x, y, label)}, the centres of the boxes; names in `plain`
    are drawn without a frame (inputs, products). arrows: (from, to, start
    offset, end offset, label, label offset) tuples, the offsets (dx, dy) from
    the boxes' centres, the last two optional; text in `fontsize` points.
    Returns the figure.
    """
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=figsize)
    ax.set_axis_off()
    for box, (bx, by, label) in boxes.items():
        framed = box not in plain
        ax.text(bx, by, label, ha="center", va="center", fontsize=fontsize,
                bbox=dict(boxstyle="round,pad=0.3", fc="#e8f0fe" if framed else "white",
                          ec="0.5" if framed else "none"))
    for a, b, da, db, *rest in arrows:
        text, toff = rest + [None, (0, 0.08)][len(rest):]
        (x0, y0, _), (x1, y1, _) = boxes[a], boxes[b]
        start, end = (x0 + da[0], y0 + da[1]), (x1 + db[0], y1 + db[1])
        ax.annotate("", xy=end, xytext=start,
                    arrowprops=dict(arrowstyle="->", color="0.3", shrinkA=0, shrinkB=0))
        if text:
            ax.text((start[0] + end[0]) / 2 + toff[0], (start[1] + end[1]) / 2 + toff[1], text,
                    fontsize=fontsize, color="0.25", ha="center")
    ax.set(xlim=xlim, ylim=ylim)
    fig.tight_layout()
    return fig


def mass_spring_animation(t, u, y, path, frames=50, fps=10, dpi=90):
    """Animate a mass on a spring: force, position and the moving mass.

    Draws `frames` snapshots with celluloid and writes a GIF to `path` with
    matplotlib's Pillow writer. Returns the path.
    """
    import matplotlib.pyplot as plt
    import numpy as np
    from celluloid import Camera
    from matplotlib import animation

    t, u, y = (np.asarray(a) for a in (t, u, y))
    if not (t.shape == u.shape == y.shape and t.ndim == 1):
        raise ValueError(f"t, u, y must be 1-D of equal length, "
                         f"got {t.shape}, {u.shape}, {y.shape}")
    if frames < 1 or frames > len(t):
        raise ValueError(f"frames must lie in [1, {len(t)}], got {frames}")
    fig, (ax_u, ax_y, ax_m) = plt.subplots(3, 1, figsize=(7, 7))
    camera = Camera(fig)
    ax_u.set_title("force u(t)")
    ax_y.set_title("position y(t)")
    ax_m.set_title("the mass")
    for ax, name in ((ax_u, "force u"), (ax_y, "position y")):
        ax.set(xlabel="time t", ylabel=name)
    ax_m.set_xlabel("displacement, in units of the largest one (the wall at -2)")
    scale = np.max(np.abs(y)) or 1.0
    for i in np.linspace(1, len(t), frames).astype(int):
        ax_u.plot(t[:i], u[:i], color="C1")
        ax_u.set_xlim(t[0], t[-1])
        ax_y.plot(t[:i], y[:i], color="C0")
        ax_y.set_xlim(t[0], t[-1])
        pos = y[i - 1] / scale  # displacement in units of the largest one
        coils = np.linspace(-2.0, 0.0 + pos, 200)  # spring from the wall at -2
        ax_m.plot(coils, 0.15 * np.sin(np.linspace(0, 24 * np.pi, 200)), color="gray")
        ax_m.plot([pos], [0.0], "s", markersize=22, color="C0")
        ax_m.axvline(-2.0, color="black", lw=3)
        ax_m.set_xlim(-2.2, 1.5)
        ax_m.set_xticks([-2, -1, 0, 1])
        ax_m.set_ylim(-1, 1)
        ax_m.set_yticks([])
        camera.snap()
    fig.tight_layout()
    anim = camera.animate()
    anim.save(path, writer=animation.PillowWriter(fps=fps), dpi=dpi)
    plt.close(fig)
    return path
