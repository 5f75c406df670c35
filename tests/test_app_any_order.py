"""The app with an any-order model: order selector, rank numbers on the grid, races of its four
schedules, and one-line refusals (paper Appendix C)."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import serve
from test_app import ui_args

from packed_ss import DecodeConfig, generate
from packed_ss.models import DualModeModel


@pytest.fixture(scope="module")
def server(tiny_model_dir, tiny_any_order_dir):
    import app

    demo = app.build_demo(str(tiny_model_dir), allowed_models=[str(tiny_any_order_dir)], new_tokens_cap=64)
    yield from serve(demo)


def test_step_through_with_confidence_order_draws_ranks_and_equals_a_full_run(client, tiny_any_order_dir):
    args = ui_args(model=str(tiny_any_order_dir), schedule="packed", order="confidence", block_size=5,
                   max_new_tokens=12)
    grids = []
    for _ in range(30):
        slider, grid, text, stats, plot, status = client.predict(*args, api_name="/step")
        if "has ended" in status:
            break
        assert "pss-error" not in status
        grids.append(grid)
        figure = json.loads(plot["plot"] if isinstance(plot, dict) else plot)
    assert grids and all('class="token-grid order-grid"' in g and 'class="rank"' in g for g in grids)
    assert any("Packed-SS (any order)" in g for g in grids)
    assert any("draft token (O)" in str(t.get("name")) for t in figure["data"])  # O rows in the legend
    model = DualModeModel.from_pretrained(tiny_any_order_dir, device="cpu", dtype=torch.float32)
    run = generate(model, model.encode("w1 w2 w3"), DecodeConfig(block_size=5, max_new_tokens=12, order="confidence"),
                   "packed")
    assert run.nfe == len(grids)
    for piece in model.token_strings(list(run.token_ids)):
        assert piece.strip() in text


def test_generate_api_takes_the_order(client, tiny_any_order_dir):
    ltr = client.predict("w1 w2 w3", schedule="packed", block_size=4, max_new_tokens=10, model=str(tiny_any_order_dir),
                         order="ltr", api_name="/generate")
    ar = client.predict("w1 w2 w3", schedule="ar", block_size=4, max_new_tokens=10, model=str(tiny_any_order_dir),
                        api_name="/generate")
    assert ltr["token_ids"] == ar["token_ids"] and ltr["nfe"] < ar["nfe"]
    confidence = client.predict("w1 w2 w3", schedule="quadratic", block_size=4, max_new_tokens=10,
                                model=str(tiny_any_order_dir), order="confidence", api_name="/generate")
    assert confidence["tokens"] == 10


def test_race_on_an_any_order_model_runs_its_own_schedules(client, tiny_any_order_dir):
    result = client.predict("w1 w2 w3", max_new_tokens=10, block_size=4, lanes="lookup,packed-mixed,diffusion",
                            model=str(tiny_any_order_dir), order="confidence", api_name="/race")
    assert set(result["lanes"]) == {"ar", "linear", "quadratic", "packed", "diffusion"}
    assert result["left_out"] == ["Prompt lookup", "Packed-SS + n-gram"]
    assert result["settings"]["order"] == "confidence"
    assert result["lanes"]["packed"]["tokens"] == 10


def test_race_page_reports_confidence_order_differences_as_expected(client, tiny_any_order_dir):
    args = ui_args(model=str(tiny_any_order_dir), order="confidence", block_size=5, max_new_tokens=24)
    note, badges, _ = client.predict(*args, ["lookup"], "same", api_name="/ui_race")
    assert "Left out: Prompt lookup" in note
    assert 'data-badge="order"' in badges and "expected" in badges and 'class="badge bad"' not in badges.split(
        'data-badge="diffusion"')[0]


@pytest.mark.parametrize("overrides,message", [
    (dict(order="confidence"), "needs an any-order model"),
    (dict(any_order=True, drafter_lora=True), "no drafter adapter"),
    (dict(order="sideways"), "order must be one of ltr, confidence"),
    (dict(any_order=True, schedule="lookup"), "Prompt lookup has no version for an any-order model"),
    (dict(any_order=True, temperature=1.0), "greedy"),
    (dict(any_order=True, drafter="scripted"), "left-to-right models only"),
])
def test_refusals_are_one_line(client, tiny_any_order_dir, overrides, message):
    from gradio_client.exceptions import AppError

    overrides = dict(overrides)
    model = str(tiny_any_order_dir) if overrides.pop("any_order", False) else ""
    settings = dict(schedule="packed", block_size=4, temperature=0.0, max_new_tokens=8, model=model, order="ltr",
                    drafter="model", drafter_lora=False)
    settings.update(overrides)
    with pytest.raises(AppError, match=message):
        client.predict("w1 w2 w3", api_name="/generate", **settings)
    if settings["order"] not in ("ltr", "confidence"):
        return  # the page's radio offers only these two (Gradio refuses others before the handler)
    slider, grid, text, stats, plot, status = client.predict(*ui_args(**settings), api_name="/step")
    if settings["drafter_lora"]:
        return  # the page shows the drafter LoRA box only when the server has an adapter
    assert message.split()[0] in status and "Traceback" not in status
