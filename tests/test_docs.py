"""The front door: README.md short and true, its figures written from their JSON, no word of who found what."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from packed_ss.bench.tables import FILES, main, rewritten

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# Who found what has no place in the project: development rounds, the people or agents who tried it. (The words are
# joined here so that this file does not match itself.)
WHO = re.compile("|".join([r"\bsession " + r"\d", r"\bsessions " + r"\d", r"\b(?:earlier|previous|next) " + "session\\b",
                           r"\btest" + r"ers?\b", r"\bnew" + r"comers?\b", r"\bre" + r"check", r"\bhelp" + r"ers? (?:found|saw)"]),
                 re.I)


def test_the_readme_is_short_keeps_the_spaces_front_matter_and_gives_the_two_set_up_commands():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200, len(text.splitlines())
    assert text.startswith("---\n") and "app_file: app.py" in text.split("---")[1]
    assert "pip install -r requirements.txt && python app.py" in text
    assert "python -m pytest -q" in text
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "python -m pytest -q" in ci and "requirements-lm-eval.txt" in ci  # CI runs what the README gives


def test_every_docs_link_of_the_readme_leads_to_a_page_that_says_what_the_reader_can_do_there():
    text = README.read_text(encoding="utf-8")
    pages = sorted(set(re.findall(r"\]\((docs/[\w./-]+\.md)\)", text)))
    assert len(pages) >= 10, pages
    for page in pages:
        lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
        assert lines[0].startswith("# ") and lines[2].startswith("What you can do here:"), (page, lines[:3])


def test_no_file_of_the_project_speaks_of_who_found_what():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    found = []
    for name in tracked:
        if not name.endswith((".py", ".md", ".txt", ".ini", ".toml", ".yaml", ".cfg")) and name != ".ci/run":
            continue
        text = (ROOT / name).read_text(encoding="utf-8", errors="replace")
        found += [f"{name}:{text[:m.start()].count(chr(10)) + 1}: {m.group(0)}" for m in WHO.finditer(text)]
    assert not found, found[:20]
    assert WHO.search("as seen in " + "session " + "27") and not WHO.search("a file you uploaded in this session")


def test_the_figures_tables_are_what_their_json_says():
    for name in FILES:
        text = (ROOT / name).read_text(encoding="utf-8")
        assert "<!-- table: " in text, name
        assert rewritten(text) == text, f"{name} differs from its JSON: run python -m packed_ss.bench.tables"
    assert main(["--check"]) == 0


def test_a_table_typed_over_by_hand_is_found_and_rewritten(tmp_path):
    text = README.read_text(encoding="utf-8")
    start = text.index("<!-- table: headline")
    row = text.index("| Packed-SS |", start)
    edited = text[:row] + text[row:].replace("| Packed-SS | 6 | 1.744 |", "| Packed-SS | 6 | 9.999 |", 1)
    assert edited != text and rewritten(edited) == text
    copy = tmp_path / "README.md"
    copy.write_text(edited, encoding="utf-8")
    assert main(["--check", str(copy)]) == 1
    assert main([str(copy)]) == 0 and copy.read_text(encoding="utf-8") == text
    with pytest.raises(ValueError, match="unknown table kind 'nope'"):
        rewritten("<!-- table: nope docs/bench-humaneval/summary.json -->\n<!-- /table -->")
