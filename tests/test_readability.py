"""What a student reads on the page says why (issue 39, item 7): the T = 1 correction that is not the verifier's token,
counts in words."""

from __future__ import annotations

from helpers import tiny_llama

from components.token_grid import grid_html
from packed_ss.config import DecodeConfig
from packed_ss.engine import decode
from packed_ss.wording import counted

PROMPT = [4, 5, 6]


def _grids(temperature: float, seeds=range(6)):
    model = tiny_llama(vocab_size=20, seed=2, logit_scale=3.0, eos=False)
    for seed in seeds:
        config = DecodeConfig(block_size=4, max_new_tokens=16, temperature=temperature, seed=seed)
        sequence = list(PROMPT)
        for record in decode(model, PROMPT, config, "packed"):
            sequence += list(record.appended)
            yield record, grid_html(record, sequence, lambda ids: [f"t{i}" for i in ids], model.mask_token_id)


def test_a_sampled_correction_that_is_not_the_verifiers_token_is_explained():
    noted = [(r, g) for r, g in _grids(1.0) if 'data-note="residual"' in g]
    assert noted, "no sampled iteration appended a correction other than the verifier's argmax"
    for record, grid in noted:
        h = record.h
        assert record.verifier_tokens[h] != record.appended[h]
        assert f"At position {record.prefix_len_before + h} the verifier row shows “t{record.verifier_tokens[h]}” " \
               f"but “t{record.appended[h]}” was appended" in grid and "residual distribution" in grid


def test_a_whitespace_correction_is_written_visibly():
    """The note printed a correction of a newline and spaces as a blank gap (issue 39)."""
    model = tiny_llama(vocab_size=20, seed=2, logit_scale=3.0, eos=False)
    sequence, notes = list(PROMPT), []
    for seed in range(6):
        config = DecodeConfig(block_size=4, max_new_tokens=16, temperature=1.0, seed=seed)
        for record in decode(model, PROMPT, config, "packed"):
            sequence += list(record.appended)
            grid = grid_html(record, sequence, lambda ids: ["\n  " if i % 2 else " " for i in ids], model.mask_token_id)
            notes += [grid.split('data-note="residual">', 1)[1].split("</div>", 1)[0]] if "residual" in grid else []
    assert notes and all("“⏎··”" in note or "“·”" in note for note in notes), notes[:2]
    assert not any("“ ”" in note or "“\n" in note for note in notes)


def test_greedy_iterations_have_no_residual_note():
    assert not any('data-note="residual"' in grid for _, grid in _grids(0.0, seeds=(0,)))


def test_counts_in_words():
    assert counted(1, "token") == "1 token" and counted(2, "token") == "2 tokens" and counted(0, "prompt") == "0 prompts"
    assert counted(1, "run per lane") == "1 run per lane" and counted(3, "run per lane") == "3 runs per lane"
    assert counted(1200, "row") == "1,200 rows" and counted(2, "child", "children") == "2 children"
