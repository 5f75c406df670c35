"""Shared look of the app: token-source colours and labels, token escaping, legend, stat cards.

The CSS classes live in ``assets/style.css``; the hex colours below mirror its ``--src-*`` variables so
plotly charts use the same colours as the HTML chips, and its ``--tok-*`` ones: the text box of tokens in the light
and the dark theme (:func:`token_colours`, tested against the CSS).
"""

from __future__ import annotations

import html
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from components.theme import DARK, LIGHT
from packed_ss.bench import palette
from packed_ss.records import (SOURCE_AR, SOURCE_BONUS, SOURCE_CORRECTION, SOURCE_DIFFUSION, SOURCE_DRAFT,
                               SOURCE_PREFILL)

ASSETS = Path(__file__).resolve().parents[1] / "assets"
PROMPT = "prompt"  # pseudo-source of the prompt tokens in the text view


@dataclass(frozen=True)
class SourceStyle:
    """CSS class suffix, chart colour (light), legend label and dark-theme background of one token source."""

    css: str
    color: str
    label: str
    dark: str = ""


SOURCE_STYLES: dict[str, SourceStyle] = {
    PROMPT: SourceStyle("prompt", "#94a3b8", "prompt"),
    # dark: the same hue, dark enough under light text (the text box turns dark in the dark theme)
    SOURCE_PREFILL: SourceStyle("prefill", "#cbd5e1", "prefill (first token)", "#475569"),
    SOURCE_DRAFT: SourceStyle("draft", "#bbf7d0", "accepted draft", "#166534"),
    SOURCE_CORRECTION: SourceStyle("correction", "#fed7aa", "correction", "#9a3412"),
    SOURCE_BONUS: SourceStyle("bonus", "#bfdbfe", "bonus", "#1e40af"),
    SOURCE_AR: SourceStyle("ar", "#e9d5ff", "autoregressive", "#6b21a8"),
    SOURCE_DIFFUSION: SourceStyle("diffusion", "#fef08a", "diffusion (unverified)", "#854d0e"),
}
OPEN_SOURCE = "open"  # an any-order model's open position in the text (components.text_view.OPEN)


@dataclass(frozen=True)
class TokenBox:
    """The text box of tokens in one theme: its background, the tokens' text, the prompt's (muted) text, and an
    open position's background and text."""

    back: str
    text: str
    muted: str
    slot: str
    slot_text: str


TOKEN_BOXES = {
    LIGHT: TokenBox(back="#ffffff", text="#0f172a", muted="#64748b", slot="#f1f5f9", slot_text="#475569"),
    DARK: TokenBox(back="#0f172a", text="#f1f5f9", muted="#94a3b8", slot="#1e293b", slot_text="#cbd5e1"),
}


def token_colours(theme: str) -> dict[str, tuple[str, str]]:
    """``(background, text)`` of a token of each source in the text box of ``theme`` (:data:`~components.theme.LIGHT`
    or :data:`~components.theme.DARK`): the prompt muted on the box itself, an open position on its own tint, every
    other source its own background under the box's text (light backgrounds and dark text, or in the dark theme
    dark backgrounds of the same hues and light text). Every pair has at least 4.5:1 (tested)."""
    box = TOKEN_BOXES[theme]
    colours = {PROMPT: (box.back, box.muted), OPEN_SOURCE: (box.slot, box.slot_text)}
    for source, style in SOURCE_STYLES.items():
        if source != PROMPT:
            colours[source] = (style.dark if theme == DARK else style.color, box.text)
    return colours


def token_css(theme: str) -> dict[str, str]:
    """The CSS variables (name: colour) that ``assets/style.css`` gives the text box of tokens in ``theme``."""
    box = TOKEN_BOXES[theme]
    names = {"--tok-box": box.back, "--tok-text": box.text, "--tok-muted": box.muted, "--tok-slot": box.slot,
             "--tok-slot-text": box.slot_text}
    return names | {f"--src-{SOURCE_STYLES[s].css}": back for s, (back, _) in token_colours(theme).items()
                    if s not in (PROMPT, OPEN_SOURCE)}

# Line colours and marker symbols of the schedules in charts: the benchmark reports' own (one colour per schedule
# everywhere), distinct from the token-source colours.
SCHEDULE_COLORS = palette.SCHEDULE_COLORS
SCHEDULE_SYMBOLS = palette.SCHEDULE_SYMBOLS


def legend_below() -> dict:
    """A plotly ``layout.legend`` under the whole chart: placed against the figure's bottom and left edges (``yref``,
    ``xref`` "container"), so plotly reserves its height first and lays the axes, their tick labels and titles out
    above it; a legend placed by a fraction of the plot (``y=-0.25``) sat over the x-axis title whenever the plot was
    short. Horizontal, from the figure's left edge (not the plot's, which long tick labels push right): the entries
    wrap onto more rows on a narrow screen."""
    return dict(orientation="h", yref="container", y=0, yanchor="bottom", xref="container", x=0, xanchor="left")


def source_class(source: str) -> str:
    """CSS class of a token source (``"src-draft"``...); unknown sources get ``"src-prompt"``."""
    style = SOURCE_STYLES.get(source, SOURCE_STYLES[PROMPT])
    return f"src-{style.css}"


# Bidirectional formatting characters: each can reorder the text around it ("evil" shown as "live"), so none is
# ever passed to the page; a mark with its short name stands in its place.
BIDI_CONTROLS = {0x061C: "ALM", 0x200E: "LRM", 0x200F: "RLM", 0x202A: "LRE", 0x202B: "RLE", 0x202C: "PDF",
                 0x202D: "LRO", 0x202E: "RLO", 0x2066: "LRI", 0x2067: "RLI", 0x2068: "FSI", 0x2069: "PDI"}


def _mark(char: str) -> str:
    """The visible stand-in of one control character (HTML): C0 controls and DEL as their Unicode control pictures
    (NUL as ␀), bidirectional controls and C1 controls as a short name, each with its code point and name on hover."""
    code = ord(char)
    name = unicodedata.name(char, "") or {0x85: "NEXT LINE"}.get(code, "control")
    if code < 0x20 or code == 0x7F:
        shown = chr(0x2400 + code) if code < 0x20 else "\u2421"
    else:
        shown = BIDI_CONTROLS.get(code, f"U+{code:04X}")
    return f'<span class="ctl" title="U+{code:04X} {html.escape(name)}">{shown}</span>'


def _hidden(char: str) -> bool:
    code = ord(char)
    return (code < 0x20 and char not in "\n\t") or 0x7F <= code <= 0x9F or code in BIDI_CONTROLS


def marked(text: str) -> str:
    """``text`` as written, as HTML: escaped, with every control character that would be invisible or would reorder
    the text around it (C0 and C1 controls but newline and tab, DEL, bidirectional formatting characters) shown as
    a named mark in its place (:func:`_mark`). The marks hold no control character: the page shows the text in the
    order it was written."""
    if not any(_hidden(c) for c in text):
        return html.escape(text)
    return "".join(_mark(c) if _hidden(c) else html.escape(c) for c in text)


def visible(token: str) -> str:
    """Token text for chips as HTML: whitespace made visible (space ·, newline ⏎, tab ⇥, carriage return ␍), control
    and bidirectional characters marked (:func:`marked`); ∅ for a token with no text."""
    if token == "":
        return "∅"
    return marked(token.replace(" ", "·").replace("\n", "⏎").replace("\t", "⇥").replace("\r", "␍"))


def load_css() -> str:
    """Contents of ``assets/style.css`` (empty string when the file is missing)."""
    path = ASSETS / "style.css"
    return path.read_text(encoding="utf-8") if path.is_file() else ""


def page_script() -> str:
    """The page's own JavaScript (``assets/page.js``, run once on load: the sidebar starts closed on a phone);
    empty when the file is missing."""
    path = ASSETS / "page.js"
    return path.read_text(encoding="utf-8") if path.is_file() else ""


def legend_html(sources: Iterable[str]) -> str:
    """A one-line legend of the given token sources (swatch + label)."""
    items = []
    for source in sources:
        style = SOURCE_STYLES[source]
        items.append(f'<span><span class="swatch src-{style.css}"></span>{html.escape(style.label)}</span>')
    return f'<div class="legend">{"".join(items)}</div>'


def stats_html(title: str, stats: Iterable[tuple[str, str, str]], kind: str) -> str:
    """A row of stat cards.

    Args:
        title: caption above the row.
        stats: ``(key, label, formatted value)`` triples; ``key`` becomes ``data-stat`` for tests.
        kind: ``data-kind`` of the row (``"iteration"``, ``"run"``...).
    """
    cards = "".join(
        f'<div class="stat" data-stat="{html.escape(key)}"><span class="k">{html.escape(label)}</span>'
        f'<span class="v">{html.escape(value)}</span></div>'
        for key, label, value in stats)
    return f'<div class="stats-title">{html.escape(title)}</div><div class="stats" data-kind="{kind}">{cards}</div>'


def error_html(message: str) -> str:
    """The page's error line (no traceback): a red sentence."""
    return f'<div class="pss-error" data-error="1">⚠ {html.escape(message)}</div>'


OPEN_SLOT = "□"  # an open position in an any-order model's text (not accepted yet)


def model_note_html(message: str) -> str:
    """The note on the model, beside the text it wrote (``div#model-note``)."""
    return f'<div class="model-note" data-note="model">{html.escape(message)}</div>'


def note_html(message: str) -> str:
    """A muted note line."""
    return f'<div class="pss-note">{html.escape(message)}</div>'
