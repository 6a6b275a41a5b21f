"""Sphinx set-up of the book that _config.yml cannot say (loaded as a local extension).

* Inline scripts once. Sphinx 7.4 adds an inline script that an extension
  registers after the builder started (sphinx-thebe's configuration) twice:
  once as it is registered, once when the page assets are collected, with
  ``''`` instead of ``None`` for its file name, so the two do not compare equal
  (fixed in Sphinx 8, which Jupyter Book 1 cannot use). The second copy
  re-declares ``const THEBE_JS_URL`` and the browser reports a SyntaxError on
  every page. Each page's script list is de-duplicated here.
* Citations by author and year that tell papers apart: "Gu et al., 2022a" and
  "Gu et al., 2022b" for two papers of the same first author, same co-author
  count and year, written the same way in the text, ``(Gu et al., 2022a)``, and
  on the references page. ``_config.yml`` selects them with
  ``bibtex_default_style: authoryear`` (the labels, a pybtex style registered
  here) and ``bibtex_reference_style: label_round`` (the labels in
  parentheses in the text).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pybtex.plugin
import sphinxcontrib.bibtex.plugin
from pybtex.richtext import Text
from pybtex.style.formatting.unsrt import Style as UnsrtStyle
from pybtex.style.labels import BaseLabelStyle
from pybtex.style.sorting import BaseSortingStyle
from sphinxcontrib.bibtex.style.referencing import BracketStyle
from sphinxcontrib.bibtex.style.referencing.label import LabelReferenceStyle


def _surname(person):
    return Text.from_latex(" ".join(person.last_names)).render_as("text")


class AuthorYearLabelStyle(BaseLabelStyle):
    """"Gu et al., 2022", with a, b, ... appended where two entries would share a label."""

    def format_label(self, entry):
        people = entry.persons.get("author") or entry.persons.get("editor") or []
        if not people:
            who = entry.fields.get("title", entry.key)
        elif len(people) == 1:
            who = _surname(people[0])
        elif len(people) == 2:
            who = f"{_surname(people[0])} and {_surname(people[1])}"
        else:
            who = f"{_surname(people[0])} et al."
        return f"{who}, {entry.fields.get('year', 'n.d.')}"

    def format_labels(self, sorted_entries):
        labels = [self.format_label(entry) for entry in sorted_entries]
        total, seen = Counter(labels), Counter()
        for label in labels:
            if total[label] > 1:
                seen[label] += 1
                label += "abcdefghijklmnopqrstuvwxyz"[seen[label] - 1]
            yield label


class AuthorYearSortingStyle(BaseSortingStyle):
    """In the order of the labels: Gu et al., 2020 before Gu et al., 2022a and 2022b."""

    def sorting_key(self, entry):
        people = entry.persons.get("author") or entry.persons.get("editor") or []
        names = [_surname(p) for p in people]
        group = names[:1] + ([names[1]] if len(names) == 2 else [])
        return (group, min(len(names), 3), entry.fields.get("year", ""),
                entry.fields.get("title", ""))


class AuthorYearStyle(UnsrtStyle):
    """The unsrt entries, sorted and labelled by author and year."""

    default_label_style = "authoryear"
    default_sorting_style = "authoryear"


def _round():
    return BracketStyle(left="(", right=")")


@dataclass
class RoundLabelReferenceStyle(LabelReferenceStyle):
    """The entry's label in the text, in parentheses: (Gu et al., 2022a)."""

    bracket_parenthetical: BracketStyle = field(default_factory=_round)
    bracket_textual: BracketStyle = field(default_factory=_round)
    bracket_author: BracketStyle = field(default_factory=_round)
    bracket_label: BracketStyle = field(default_factory=_round)
    bracket_year: BracketStyle = field(default_factory=_round)


pybtex.plugin.register_plugin("pybtex.style.labels", "authoryear", AuthorYearLabelStyle)
pybtex.plugin.register_plugin("pybtex.style.sorting", "authoryear", AuthorYearSortingStyle)
pybtex.plugin.register_plugin("pybtex.style.formatting", "authoryear", AuthorYearStyle)
sphinxcontrib.bibtex.plugin.register_plugin(
    "sphinxcontrib.bibtex.style.referencing", "label_round", RoundLabelReferenceStyle)


def _key(script):
    attrs = getattr(script, "attributes", {}) or {}
    return (getattr(script, "filename", script) or "", tuple(sorted(attrs.items())))


def dedupe_scripts(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, kept = set(), []
    for script in scripts:
        key = _key(script)
        if key not in seen:
            seen.add(key)
            kept.append(script)
    context["script_files"] = kept


def setup(app):
    app.connect("html-page-context", dedupe_scripts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
