"""The front door: README.md short and true, its figures written from their JSON, no word of who found what."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from packed_ss.bench import grid
from packed_ss.bench.tables import FILES, main, rewritten, unmarked_figures

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


def test_no_table_of_figures_is_typed_by_hand():
    # the model cards' training tables (steps, losses, agreement) come from training logs, not from a measuring command;
    # app.md's hardware table is arithmetic (the weights' sizes), not a measurement
    for name in [f for f in FILES if not f.startswith("assets/") and f != "docs/app.md"]:
        assert unmarked_figures((ROOT / name).read_text(encoding="utf-8")) == [], name
    typed = "Text.\n\n| path | 1 row (ms) |\n|---|---|\n| native | 0.854 |\n\nMore text.\n"
    assert unmarked_figures(typed) == ["| path | 1 row (ms) |"]
    words = "| schedule | rows |\n|---|---|\n| Packed-SS | 2B |\n"
    fenced = "```\n" + typed + "```\n"
    assert unmarked_figures(words) == [] and unmarked_figures(fenced) == []


def test_a_scripts_grid_is_drawn_with_its_provenance_and_rows_replace_by_key(tmp_path):
    columns = [grid.Column("comparison"), grid.Column("AR", 3), grid.Column("vs", 2, "x")]
    path = tmp_path / "forms.json"
    grid.put_row(path, columns, "--threads 1", ["one thread", 0.9612, 1.5], note="B = 8")
    grid.put_row(path, columns, "--threads 2", ["two threads", 0.95, {"estimate": 1.1, "low": 1.0, "high": 1.2}])
    data = grid.put_row(path, columns, "--threads 1", ["one thread", 0.97, None])
    assert [row[0] for row in data["rows"]] == ["one thread", "two threads"] and len(data["runs"]) == 2
    said, table = grid.render(data).split("\n\n")
    assert said.startswith("Measured on ") and "`python " in said
    assert table.splitlines()[2:] == ["| one thread | 0.970 | - |", "| two threads | 0.950 | 1.10 [1.00, 1.20] |"]
    with pytest.raises(ValueError, match="2 values for 3 columns"):
        grid.save(tmp_path / "bad.json", columns, [["a", 1.0]])
    with pytest.raises(ValueError, match="other columns"):
        grid.put_row(path, columns[:2], "k", ["a", 1.0])
    marked = f"<!-- table: grid {path} -->\nold\n<!-- /table -->"
    assert rewritten(marked, root=tmp_path) == f"<!-- table: grid {path} -->\n" + grid.render(data) + "<!-- /table -->"


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
