"""What the page says, checked without a browser: the race verdict's reason and the paper's comparisons,
the break-even tokens/NFE, the model note, the lane grid's columns, the few-prompt warning."""

import numpy as np
import pytest

from components.charts import CostModel, break_even, break_even_figure
from components.race_panel import lane_columns, summary_html
from packed_ss.bench.report import FEW_PROMPTS, few_prompts_warning
from serve.lanes import Lane, cost_ratio, paper_comparisons, verdict_text, why_text


def lane(schedule: str, title: str, tokens_per_nfe: float, ms_per_call: float, wall_s: float, rows: int = 1,
         rounds: int = 16, jitter: float = 0.01, seed: int = 0) -> Lane:
    """A lane of 64 tokens in ``wall_s`` seconds, made over ``rounds`` rounds of equal tokens whose times scatter
    by ``jitter`` (relative, seeded)."""
    metrics = {"tokens_per_nfe": tokens_per_nfe, "time_per_nfe_ms": ms_per_call, "block_size": 8, "tokens": 64,
               "nfe": round(64 / tokens_per_nfe), "throughput": 64 / wall_s, "mean_acceptance_length": 1.0,
               "wall_s": wall_s}
    noise = 1 + jitter * np.random.default_rng(seed).standard_normal(rounds)
    slices = tuple((64 // rounds, float(ms)) for ms in wall_s * 1000 / rounds * noise / noise.mean())
    return Lane(schedule=schedule, title=title, token_ids=(1,) * 64, sources=(), wall_ms=(wall_s * 1000,), nfe=(1,),
                tokens=(64,), metrics=metrics, slices=slices, max_rows_per_call=rows)


AR = lane("ar", "Autoregressive", 1.0, 1.6, 0.10, seed=1)
LINEAR = lane("linear", "Linear-SS", 1.5, 2.4, 0.16, rows=8, seed=2)
QUADRATIC = lane("quadratic", "Quadratic-SS", 2.2, 4.4, 0.19, rows=72, seed=3)
SLOW_PACKED = lane("packed", "Packed-SS", 2.0, 3.0, 0.12, rows=16, seed=4)


def test_when_ar_wins_the_verdict_says_packed_ss_accepted_more_but_paid_more_per_call():
    lanes = [AR, LINEAR, QUADRATIC, SLOW_PACKED]
    assert cost_ratio(SLOW_PACKED, AR) == pytest.approx(3.0 / 1.6)
    why = why_text(lanes, AR)
    assert why.startswith("Why: Packed-SS accepted 2.00 tokens per call, but its calls (up to 16 rows) cost 1.88x")
    assert "so AR is faster here" in why and "Appendix F" in why
    text = verdict_text(lanes)
    assert text.startswith("Fastest: Autoregressive") and why in text


def test_when_packed_ss_wins_the_reason_is_tokens_per_call_over_cost_per_call():
    fast = lane("packed", "Packed-SS", 2.0, 1.8, 0.06, rows=16)
    why = why_text([AR, fast], fast)
    assert why == ("Why: Packed-SS accepted 2.00 tokens per call and its calls (up to 16 rows) cost 1.12x AR's "
                   "one-row calls on this machine, so it runs at about 1.78x AR's speed.")


def test_the_papers_comparisons_give_each_ratio_with_its_interval_and_flag_ties():
    tied = lane("linear", "Linear-SS", 1.5, 2.4, 0.121, rows=8, jitter=0.15, seed=5)
    text = paper_comparisons([AR, tied, QUADRATIC, SLOW_PACKED])
    assert text.startswith("The paper's comparisons, speed over speed: Packed-SS / Linear-SS 1.01 [")
    assert "Packed-SS / Linear-SS 1.01 [" in text and "(a tie: the interval holds 1)" in text
    assert "Packed-SS / Quadratic-SS 1.58 [" in text and "(faster, beyond noise)" in text
    assert "Packed-SS / Autoregressive 0.83 [" in text and "(slower, beyond noise)" in text  # below 1: slower
    assert paper_comparisons([AR, LINEAR]) == ""  # no Packed-SS lane, nothing to compare


def test_the_race_table_gives_time_per_call_over_ars():
    table = summary_html([AR, SLOW_PACKED])
    assert "ms/NFE ÷ AR" in table
    assert "data-col='cost-ratio' data-label='ms/NFE ÷ AR'>1.00</td>" in table
    assert "data-col='cost-ratio' data-label='ms/NFE ÷ AR'>1.88</td>" in table


def test_break_even_is_the_mean_call_cost_over_one_row_calls():
    cost = CostModel(tau_ms=1.0, delta_ms=0.1, calls=10, min_rows=1, max_rows=64, rmse_ms=0.0)
    # Packed-SS at B = 8: one 16-row call: (1 + 1.6) / (1 + 0.1); Linear-SS: two 8-row calls, same mean.
    assert break_even("packed", 8, cost) == pytest.approx(2.6 / 1.1)
    assert break_even("linear", 8, cost) == pytest.approx(1.8 / 1.1)
    assert break_even("quadratic", 2, cost) == pytest.approx(1.6 / 1.1)
    free_rows = CostModel(tau_ms=1.0, delta_ms=0.0, calls=10, min_rows=1, max_rows=64, rmse_ms=0.0)
    assert break_even("quadratic", 16, free_rows) == pytest.approx(1.0)  # rows cost nothing: any acceptance wins
    figure = break_even_figure(cost, [("packed", 7, 2.1, 40)])
    names = [t.name for t in figure.data]
    assert "Packed-SS: needed to beat AR" in names and "Packed-SS: measured here" in names


def test_lane_grid_never_leaves_one_card_alone():
    for n in range(1, 9):
        columns = lane_columns(n)
        assert 1 <= columns <= 4
        assert n % columns != 1 or n == 1 or columns == 1, (n, columns)
    assert [lane_columns(n) for n in (4, 5, 6, 7, 8)] == [4, 3, 3, 4, 4]


def test_few_prompts_get_a_warning():
    assert "Only 2 prompts" in few_prompts_warning(2)
    assert few_prompts_warning(FEW_PROMPTS) == ""


def test_the_model_note_of_the_embedded_model_and_of_any_other(tiny_model_dir):
    from serve.models import DEFAULT_MODEL, ModelStore
    from serve.notes import count_text, model_note

    store = ModelStore(DEFAULT_MODEL, allowed=[str(tiny_model_dir)])
    embedded = model_note(store, "", store.get(""))
    assert "embedded demo model (5.5M parameters" in embedded and "not meant to make sense" in embedded
    assert "python app.py --model nvidia/Nemotron-Labs-Diffusion-3B" in embedded
    other = model_note(store, str(tiny_model_dir), store.get(str(tiny_model_dir)))
    assert "dual-mode plain-family model" in other and "float32 on cpu" in other and "parameters" in other
    assert [count_text(n) for n in (900, 5_512_000, 3_000_000_000)] == ["900", "5.5M", "3.0B"]


def test_with_fewer_than_four_paired_slices_no_winner_is_named_and_no_reason_given():
    few = [lane("ar", "Autoregressive", 1.0, 1.6, 0.10, rounds=2),
           lane("lookup", "Prompt lookup", 1.9, 0.53, 0.05, rows=8, rounds=2)]
    text = verdict_text(few)
    assert text.startswith("No winner can be judged: 2 paired slices are too few to tell a difference from noise")
    assert "beyond noise" not in text and "Why:" not in text and "Fastest" not in text
    enough = [lane("ar", "Autoregressive", 1.0, 1.6, 0.10, rounds=4),
              lane("lookup", "Prompt lookup", 1.9, 1.0, 0.05, rows=8, rounds=4)]
    assert verdict_text(enough).startswith("Fastest: Prompt lookup, beyond noise against every other lane")


def test_the_verdict_names_the_fastest_lane_and_every_other_lanes_ratio_with_its_interval():
    text = verdict_text([AR, LINEAR, QUADRATIC, SLOW_PACKED])
    assert text.startswith("Fastest: Autoregressive, beyond noise against every other lane. Speed over "
                           "Autoregressive's (95% interval over 16 paired slices): Packed-SS 0.83 [")
    assert "1. Autoregressive 640.0 tokens/s, 2. Packed-SS 533.3 tokens/s" in text
    close = lane("packed", "Packed-SS", 2.0, 3.0, 0.101, rows=16, jitter=0.2, seed=9)
    assert verdict_text([AR, close]).startswith("No clear winner: Autoregressive is fastest but ties with Packed-SS")


def test_multi_row_calls_cheaper_than_ars_one_row_calls_are_called_noise_not_a_reason():
    cheap = lane("lookup", "Prompt lookup", 1.9, 0.53, 0.05, rows=8)
    why = why_text([AR, cheap], cheap)
    assert why.startswith("Noise, not a reason: Prompt lookup's calls of up to 8 rows measured 0.33x AR's one-row")
    assert "runs at about" not in why
    single = lane("lookup", "Prompt lookup", 1.0, 1.5, 0.09, rows=1)
    assert not why_text([AR, single], single).startswith("Noise")  # one-row calls may cost less: no claim
    few = [lane("ar", "Autoregressive", 1.0, 1.6, 0.10, rounds=1),
           lane("lookup", "Prompt lookup", 1.9, 0.53, 0.05, rows=8, rounds=1)]
    assert "Noise, not a reason" in verdict_text(few)


@pytest.mark.parametrize("rmse_ms, verdict", [(0.5, "beats AR here"), (50.0, "too noisy to judge")])
def test_the_break_even_gives_no_verdict_on_a_fit_too_noisy_to_judge(rmse_ms, verdict):
    """Explain said "beats AR here" on a fit whose residual was 25x tau while the race had Packed-SS at 0.25x AR
    (issue 30): a fit that fit_summary warns about gives no verdict."""
    from components.charts import break_even_summary

    fit = CostModel(tau_ms=2.0, delta_ms=0.01, calls=40, min_rows=1, max_rows=16, rmse_ms=rmse_ms)
    text = break_even_summary(fit, [("packed", 7, 3.0, 40)])
    assert f"Packed-SS at W = 7: 3.00 tokens/NFE measured" in text and verdict in text
    assert ("beats AR" in text) == (rmse_ms < 2.0 * 2.0)


def test_the_break_even_judges_only_where_the_fit_predicts_the_measured_iterations():
    """Explain said every width "beats AR here" while AR's iterations measured about 150 ms against a fit with
    tau 773.6 ms and an RMS residual of 690.6 ms (issue 39): no verdict where the fit misses the measured iterations,
    or where the tokens/NFE lies within the break-even's range under the fit's own error."""
    from components.charts import break_even_summary

    loose = CostModel(tau_ms=773.6, delta_ms=5.0, calls=40, min_rows=1, max_rows=64, rmse_ms=690.6)
    text = break_even_summary(loose, [("packed", 7, 3.0, 40)], [("ar", 7, 150.0)] * 9 + [("packed", 7, 2500.0)] * 5)
    assert "beats AR" not in text and "cannot judge" in text
    assert "the fit's RMS error (690.60 ms) is as large as a one-row call" in text or "beyond 2× its RMS" in text
    missed = CostModel(tau_ms=2.0, delta_ms=0.01, calls=40, min_rows=1, max_rows=16, rmse_ms=0.2)
    text = break_even_summary(missed, [("packed", 7, 3.0, 40)], [("ar", 7, 9.0)] * 5)
    assert "cannot judge: the fit predicts AR's iterations at 2.01 ms, but they measured 9.00 ms" in text
    close = CostModel(tau_ms=2.0, delta_ms=0.1, calls=40, min_rows=1, max_rows=16, rmse_ms=0.5)
    near = break_even_summary(close, [("packed", 7, 1.7, 40)], [("ar", 7, 2.1)] * 5 + [("packed", 7, 3.6)] * 5)
    assert "cannot judge: within the fit's RMS error (0.50 ms) the break-even lies between" in near
    clear = break_even_summary(close, [("packed", 7, 3.5, 40)], [("ar", 7, 2.1)] * 5 + [("packed", 7, 3.6)] * 5)
    assert "beats AR here" in clear
    assert "loses to AR here" in break_even_summary(close, [("packed", 7, 1.0, 40)], [("ar", 7, 2.1)] * 5)


def test_an_interval_end_next_to_1_shows_which_side_it_is_on():
    """"0.83 [0.71, 1.00]" was called beyond noise and "0.81 [0.65, 1.00]" a tie on the same page (issue 53)."""
    from packed_ss.stats import Interval
    from serve.lanes import is_tie, ratio_text

    beyond, tie = Interval(0.83, 0.71, 0.9981, 16), Interval(0.81, 0.65, 1.0004, 16)
    assert ratio_text(beyond) == "0.83 [0.71, 0.998]" and not is_tie(beyond)
    assert ratio_text(tie) == "0.81 [0.65, 1.0004]" and is_tie(tie)
    assert ratio_text(Interval(0.5, 0.48, 0.57, 14)) == "0.50 [0.48, 0.57]"


def test_the_step_text_says_which_forward_ran_and_its_calls_over_the_floor():
    """The page says which path ran and its calls' ratio to the floor (the larger of their arithmetic and one read of
    the weights at the measured bandwidth), once the floor is known for the network."""
    from helpers import tiny_llama
    from packed_ss import DecodeConfig, generate
    from packed_ss.cost import Roofline
    from serve.notes import forward_note

    model = tiny_llama(seed=1)
    run = generate(model, [3, 4, 5], DecodeConfig(block_size=4, max_new_tokens=6), "packed")
    assert forward_note(model, run.records) == "Calls: the native forward, eager calls."
    model.model.roofline_fit = Roofline(flops_per_row=1e3, weight_bytes=1_000_000, gflops=10.0, read_gbs=10.0)
    times = sorted(call.model_ms for record in run.records for call in record.calls)  # read-bound: 0.1 ms each
    note = forward_note(model, run.records)
    assert f"{times[len(times) // 2] / 0.1:.1f}x the floor (the larger of their arithmetic and one read of the " \
           f"weights, 0.10 ms" in note and "10 GB/s" in note
    other = tiny_llama(seed=1, path="transformers")
    assert forward_note(other, run.records).startswith("Calls: transformers' forward, eager calls")


def test_best_b_names_the_lanes_left_at_the_sidebars_b():
    """"Each schedule at its best B" left Block-diffusion at the sidebar's B without a word on the page."""
    from serve.race import sizes_source

    probe = "each schedule's best B from a short probe"
    found = {"linear": 4, "quadratic": 2, "packed": 8}
    text = sizes_source(probe, ["ar", "linear", "quadratic", "packed", "diffusion"], found, 8)
    assert text == f"{probe}; Block diffusion has no best B of its own and ran at the sidebar's B = 8"
    both = sizes_source(probe, ["ar", "linear", "quadratic", "packed", "lookup", "diffusion"], found, 16)
    assert both.endswith("Prompt lookup and Block diffusion have no best B of their own and ran at the sidebar's "
                         "B = 16")
    assert sizes_source(probe, ["ar", "linear", "quadratic", "packed"], found, 8) == probe  # every lane had its own
    assert sizes_source("", ["ar", "diffusion"], None, 8) == ""  # the same B for every lane: nothing to name
