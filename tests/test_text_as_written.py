"""Text as people wrote it: byte tokens shown as their bytes, NUL and other controls as named marks, bidirectional
controls neutralised and marked wherever a prompt or an output is shown (a U+202E in a prompt made "evil" read
"live"), and counts in the number they need ("1 CPU thread")."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.style import BIDI_CONTROLS, marked, visible
from components.text_view import text_html

EMBEDDED = Path(__file__).resolve().parents[1] / "assets" / "model"
BIDI = "".join(chr(code) for code in BIDI_CONTROLS)


def test_bidirectional_and_control_characters_never_reach_the_page_and_are_marked_in_place():
    page = marked("say \u202eevil\u202c now\x00!\x7f\x85")
    assert not any(c in page for c in BIDI) and "\x00" not in page and "\x7f" not in page and "\x85" not in page
    assert page.index(">RLO<") < page.index("evil") < page.index(">PDF<") < page.index("now")  # in written order
    assert 'title="U+202E RIGHT-TO-LEFT OVERRIDE"' in page and ">\u2400<" in page and ">\u2421<" in page
    assert "U+0085" in page
    assert marked("a\nb\tc <d> & e") == "a\nb\tc &lt;d&gt; &amp; e"  # newline, tab and plain text as they are
    chip = visible("\x00")
    assert chip != "∅" and ">\u2400<" in chip and "\x00" not in chip  # a NUL token is not the empty token
    assert visible("") == "∅" and visible(" a\n") == "·a⏎"


def test_the_text_view_shows_a_prompt_and_tokens_with_bidi_controls_as_written():
    html = text_html([1, 2], [5, 6], ["accepted draft", "correction"], lambda ids: [f"t{i}\u202e" for i in ids],
                     prompt_text="x = 'evil\u202elive'")
    assert not any(c in html for c in BIDI)
    assert html.count(">RLO<") == 3 and html.index("evil") < html.index(">RLO<")


@pytest.mark.skipif(not (EMBEDDED / "model.safetensors").exists(), reason="assets/model has no weights")
def test_byte_tokens_show_their_bytes_and_whole_characters_their_text():
    from packed_ss.models import DualModeModel

    model = DualModeModel.from_pretrained(EMBEDDED, device="cpu")
    ids = model.encode("a\U0001F600b\x00c")
    strings = model.token_strings(ids)
    assert strings[:5] == ["a", "<0xF0>", "<0x9F>", "<0x98>", "<0x80>"], strings
    assert "\x00" in strings and "\ufffd" not in "".join(strings)
    assert model.token_strings(model.encode("def f(x):")) == [model.decode([i]) for i in model.encode("def f(x):")]


def test_a_report_counts_its_threads_in_the_number_they_need():
    from packed_ss.bench.report import _header

    config = {"block_sizes": {}, "temperature": 0.0, "samples": 1, "max_new_tokens": 16, "seed": 0, "warmup": True}
    meta = {"prompts_measured": 1, "threads": 1}
    assert "1 CPU thread." in "\n".join(_header({"meta": meta, "config": config}))
    assert "2 CPU threads." in "\n".join(_header({"meta": {**meta, "threads": 2}, "config": config}))
