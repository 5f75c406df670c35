"""Gradio app: the page's events and the API driven through gradio_client against a server started here.

The server uses a tiny Llama folder written by the test (fast, deterministic); one test switches the
model field to the embedded model. Components are also checked on their own (grid, mask, cost fit).
"""

import html
import json
import re
import threading
from pathlib import Path

import pytest
import torch

from helpers import serve

from packed_ss.config import DecodeConfig
from packed_ss.engine import generate

CAP = 64
SETTINGS = dict(model="", prompt="w1 w2 w3", schedule="packed", block_size=4, temperature=0.0, top_k=0, top_p=1.0,
                seed=0, max_new_tokens=10, drafter_lora=False, precision="", drafter="model", drafter_quality=0.8,
                order="ltr", chat=False)


def ui_args(**overrides):
    """The page's settings in the order of the step/race events."""
    s = {**SETTINGS, **overrides}
    return (s["model"], s["prompt"], s["schedule"], s["block_size"], s["temperature"], s["top_k"], s["top_p"],
            s["seed"], s["max_new_tokens"], s["drafter_lora"], s["precision"], s["drafter"], s["drafter_quality"],
            s["order"], s["chat"])


@pytest.fixture(scope="module")
def broken_model(tmp_path_factory):
    """A folder the server offers that cannot be loaded (no config.json)."""
    return str(tmp_path_factory.mktemp("broken-model"))


@pytest.fixture(scope="module")
def server(tiny_model_dir, broken_model):
    import app
    from conftest import EMBEDDED

    demo = app.build_demo(str(tiny_model_dir), allowed_models=[str(EMBEDDED), broken_model], new_tokens_cap=CAP,
                          step_concurrency=4)
    yield from serve(demo)


def stat(html: str, key: str) -> str:
    """Value of the stat card ``data-stat=key`` in a stats fragment."""
    match = re.search(rf'data-stat="{key}"><span class="k">[^<]*</span><span class="v">([^<]*)</span>', html)
    assert match, f"no stat {key} in {html[:200]}"
    return match.group(1)


def grid_iteration(html: str) -> int:
    return int(re.search(r'data-iteration="(\d+)"', html).group(1))


# --- stepping -----------------------------------------------------------------------------------
def test_step_to_the_end_back_and_scrub(client, tiny_model_dir):
    outputs = None
    for expected in range(1, SETTINGS["max_new_tokens"] + 2):
        outputs = client.predict(*ui_args(), api_name="/step")
        slider, grid, text, stats, plot, status = outputs
        if "has ended" in status:
            break
        assert grid_iteration(grid) == expected and slider["value"] == expected
        assert 'class="token-grid"' in grid and "verifier v" in grid and "proposals z" in grid
        assert plot is not None  # a new iteration redraws the mask
        assert int(stat(stats, "nfe")) == expected
    else:
        pytest.fail("the run never ended")
    stop = stat(stats, "stop")
    assert stop in ("limit", "eos")
    tokens = int(stat(stats, "tokens"))
    assert 1 <= tokens <= SETTINGS["max_new_tokens"]
    # The text so far equals a full run of the same settings.
    from packed_ss.models import DualModeModel

    model = DualModeModel.from_pretrained(tiny_model_dir, device="cpu", dtype=torch.float32)
    run = generate(model, model.encode(SETTINGS["prompt"]), DecodeConfig(block_size=4, max_new_tokens=10), "packed")
    assert run.tokens == tokens
    done = slider["value"]
    slider, grid, *_ = client.predict(api_name="/back")
    assert slider["value"] == done - 1 and grid_iteration(grid) == done - 1
    slider, grid, _, _, plot, _ = client.predict(1, api_name="/scrub")
    assert slider["value"] == 1 and grid_iteration(grid) == 1 and slider["maximum"] == done
    assert "plot" in plot
    slider, grid, _, _, plot, _ = client.predict(1, api_name="/scrub")  # same iteration: heatmap not redrawn
    assert grid_iteration(grid) == 1 and plot == {"__type__": "update"}
    # Step moves forward through the history before computing anything new.
    slider, grid, *_ = client.predict(*ui_args(), api_name="/step")
    assert grid_iteration(grid) == 2
    slider, grid, text, stats, plot, status, *_ = client.predict(api_name="/reset")
    assert grid_iteration(grid) == 0 and "Reset" in status


@pytest.mark.parametrize("schedule,title,calls", [("packed", "Packed-SS", 1), ("linear", "Linear-SS", 2),
                                                  ("quadratic", "Quadratic-SS", 1), ("ar", "Autoregressive", 1),
                                                  ("diffusion", "Block diffusion", 1)])
def test_every_schedule_steps_and_draws_its_calls(client, schedule, title, calls):
    for _ in range(2):
        slider, grid, text, stats, plot, status = client.predict(*ui_args(schedule=schedule), api_name="/step")
    assert title in grid and grid_iteration(grid) == 2
    assert "pss-error" not in status
    # which forward ran, and the calls over the weight-read floor, measured for the page (issue 55)
    assert "Calls: " in text and "x the floor (the larger of their arithmetic and one read of the weights" in text, text
    figure = json.loads(plot["plot"] if isinstance(plot, dict) else plot)
    heatmaps = [trace for trace in figure["data"] if trace["type"] == "heatmap"]
    assert len(heatmaps) == calls  # Linear-SS shows its draft call and its verify call
    assert any("cached prefix" in str(trace["x"][0]) for trace in heatmaps)  # the cache folded into one band


# --- race ---------------------------------------------------------------------------------------
def test_race_api_greedy_lanes_agree(client):
    result = client.predict("w1 w2 w3", max_new_tokens=12, block_size=4, lanes="ar,diffusion", api_name="/race")
    assert set(result["lanes"]) == {"ar", "linear", "quadratic", "packed", "diffusion"}
    assert result["lossless_identical_to_ar"] is True
    ar = result["lanes"]["ar"]["token_ids"]
    for name in ("linear", "quadratic", "packed"):
        lane = result["lanes"][name]
        assert lane["token_ids"] == ar and lane["identical_to_ar"] is True
        for key in ("nfe", "tokens", "wall_s", "tokens_per_nfe", "time_per_nfe_ms", "throughput"):
            assert key in lane
    assert "first_difference" in result["lanes"]["diffusion"]  # diffusion is compared, not hidden
    plain = client.predict("w1 w2 w3", max_new_tokens=6, api_name="/race")
    assert plain["lanes"]["ar"]["shown"] is True and plain["lossless_identical_to_ar"] is True  # AR is a lane


def test_race_measures_lanes_in_turns_and_states_a_verdict_from_paired_slices(client):
    result = client.predict("w1 w2 w3", max_new_tokens=8, block_size=4, api_name="/race")
    assert result["rounds"] >= 2 and min(result["slice_tokens"]) >= 1 and result["stopped_at_tokens"] is None
    titles = {"ar": "Autoregressive", "linear": "Linear-SS", "quadratic": "Quadratic-SS", "packed": "Packed-SS"}
    for name, lane in result["lanes"].items():
        assert len(lane["slices"]) == result["rounds"], name  # one (tokens, ms) per round, aligned
        assert sum(t for t, _ in lane["slices"]) == lane["tokens"] == 8, name
        assert sum(ms for _, ms in lane["slices"]) == pytest.approx(1000 * lane["wall_s"]), name
        assert lane["throughput"] == pytest.approx(lane["tokens"] / lane["wall_s"])
        if name != "ar":
            ratio = lane["speed_vs_ar"]
            assert ratio["low"] <= ratio["estimate"] <= ratio["high"] and ratio["n"] >= 1
    fastest = max(result["lanes"], key=lambda name: result["lanes"][name]["throughput"])
    ranked = sorted(result["lanes"], key=lambda name: -result["lanes"][name]["throughput"])
    ranking = ", ".join(f"{i}. {titles[name]} {result['lanes'][name]['throughput']:.1f} tokens/s"
                        for i, name in enumerate(ranked, 1))
    assert f"Ranking by tokens per second of decoder time: {ranking}." in result["verdict"]
    assert f"Speed over {titles[fastest]}'s (95% interval over" in result["verdict"]


def test_race_page_event_and_replay(client):
    status, badge, _ = client.predict(*ui_args(max_new_tokens=8), ["diffusion"], "same", api_name="/ui_race")
    assert "pss-error" not in status and "identical to AR" in badge
    job = client.submit(4.0, api_name="/replay")
    lanes, fig_nfe, fig_wall, fig_theorem, summary = job.result(timeout=60)
    for name in ("linear", "quadratic", "packed", "diffusion"):
        assert f'data-lane="{name}" data-done="1"' in lanes
    assert 'data-lane="ar" data-done="1"' in lanes  # AR, the baseline, is a lane by default
    assert 'data-badge="verdict"' in badge and "Ranking by tokens per second of decoder time" in badge
    assert re.search(r'data-counter="nfe">[1-9]', lanes)
    assert fig_nfe is not None and fig_wall is not None and "race-summary" in summary


def test_documented_api_is_generate_and_race(client):
    """As docs/app.md says: the page's own events (the Benchmark view's included) are callable but not listed."""
    api = client.view_api(print_info=False, return_format="dict")
    assert set(api["named_endpoints"]) == {"/generate", "/race"}


def test_generate_api_defaults(client):
    result = client.predict("w1 w2", max_new_tokens=5, api_name="/generate")
    assert result["schedule"] == "packed" and 1 <= result["tokens"] <= 5 and result["nfe"] >= 1


# --- bad input ------------------------------------------------------------------------------------
BAD = [
    (dict(prompt=""), "prompt is empty"),
    (dict(prompt="w3 " * 600), "exceeds the model"),
    (dict(max_new_tokens=CAP + 1), "new-token limit"),
    (dict(block_size=1), "block size"),
    (dict(block_size=33), "block size"),
    (dict(temperature=-1.0), "temperature"),
    (dict(model="/nonexistent/model-folder"), "not offered"),
    (dict(prompt=123), "must be text"),
]


@pytest.mark.parametrize("overrides,message", BAD)
def test_bad_input_answered_by_the_api(client, overrides, message):
    from gradio_client.exceptions import AppError

    s = {**SETTINGS, **overrides}
    with pytest.raises(AppError, match=message):
        client.predict(s["prompt"], schedule=s["schedule"], block_size=s["block_size"], temperature=s["temperature"],
                       max_new_tokens=s["max_new_tokens"], model=s["model"], api_name="/generate")
    with pytest.raises(AppError, match=message):
        client.predict(s["prompt"], block_size=s["block_size"], temperature=s["temperature"],
                       max_new_tokens=s["max_new_tokens"], model=s["model"], api_name="/race")


@pytest.mark.parametrize("overrides,message", [b for b in BAD if not {"block_size", "temperature"} & set(b[0])
                                                and not isinstance(b[0].get("prompt", ""), int)]
                         + [(dict(model="unloadable"), "config.json"), (dict(top_k=-1), "top-k"),
                            (dict(seed=-1), "seed"), (dict(seed=2**70), "seed")])
def test_bad_input_on_the_page_leaves_the_session_usable(client, broken_model, overrides, message):
    if overrides.get("model") == "unloadable":
        overrides = dict(model=broken_model)  # offered, but a folder without config.json
    slider, grid, text, stats, plot, status = client.predict(*ui_args(**overrides), api_name="/step")
    assert "pss-error" in status and message in status and "Traceback" not in status
    assert str(Path(broken_model).parent) not in status  # never the server's folders
    slider, grid, text, stats, plot, status = client.predict(*ui_args(), api_name="/step")
    assert "pss-error" not in status and grid_iteration(grid) == 1


def test_scrub_past_either_end_keeps_slider_and_grid_together(client):
    """A number typed past the last iteration (or below 0) is clamped: the slider shows what the grid shows."""
    for _ in range(3):
        client.predict(*ui_args(prompt="w2 w4 w6"), api_name="/step")
    slider, grid, *_, status = client.predict(100, api_name="/scrub")
    assert slider["value"] == 3 and grid_iteration(grid) == 3 and "pss-error" not in status
    slider, grid, *_ = client.predict(-5, api_name="/scrub")
    assert slider["value"] == 0 and grid_iteration(grid) == 0
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match="^the iteration must be a number, got 'two'$"):  # one line; nothing moves
        client.predict("two", api_name="/scrub")
    slider, grid, *_ = client.predict(0, api_name="/scrub")
    assert slider["value"] == 0 and grid_iteration(grid) == 0


def test_page_sliders_reject_out_of_range_values(client):
    """The page's block-size and temperature sliders are bounded; the server refuses values outside in one line
    (the settings' own validation, as for every other value: the event takes its values raw)."""
    for overrides, message in ((dict(block_size=1), "block size must be a whole number from 2 to 32, got 1"),
                               (dict(block_size=40), "block size must be a whole number from 2 to 32, got 40"),
                               (dict(temperature=-1.0), "temperature must be >= 0")):
        *_, status = client.predict(*ui_args(**overrides), api_name="/step")
        assert "pss-error" in status and message in html.unescape(status)
    *_, status = client.predict(*ui_args(), api_name="/step")
    assert "pss-error" not in status


# --- per-user state -------------------------------------------------------------------------------
def test_two_clients_at_once_keep_separate_state(server):
    from gradio_client import Client

    users = {"a": (Client(server, verbose=False), ui_args(prompt="w5 w6", schedule="linear")),
             "b": (Client(server, verbose=False), ui_args(prompt="w9 w9 w8", schedule="quadratic"))}
    results: dict[str, list] = {"a": [], "b": []}
    errors = []

    def stepper(name):
        c, args = users[name]
        try:
            for _ in range(3):
                results[name].append(c.predict(*args, api_name="/step"))
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=stepper, args=(n,)) for n in users]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    for name, title in (("a", "Linear-SS"), ("b", "Quadratic-SS")):
        iterations = [grid_iteration(out[1]) for out in results[name]]
        assert iterations == [1, 2, 3], (name, iterations)
        assert title in results[name][-1][1]
    assert "w5 w6" in results["a"][-1][2] and "w9 w9 w8" not in results["a"][-1][2]
    assert "w9 w9 w8" in results["b"][-1][2] and "w5 w6" not in results["b"][-1][2]


# --- the embedded model through the model field ---------------------------------------------------------
def test_embedded_model_in_the_model_field(client):
    from conftest import EMBEDDED

    if not (EMBEDDED / "model.safetensors").exists():
        pytest.skip("assets/model has no weights yet")
    args = ui_args(model=str(EMBEDDED), prompt="def add(a, b):\n", block_size=8, max_new_tokens=12)
    for expected in (1, 2):
        slider, grid, text, stats, plot, status = client.predict(*args, api_name="/step")
        assert "pss-error" not in status and grid_iteration(grid) == expected
    result = client.predict("def add(a, b):\n", max_new_tokens=16, model=str(EMBEDDED), api_name="/race")
    assert result["lossless_identical_to_ar"] is True and result["lanes"]["packed"]["tokens"] >= 1


# --- components on their own ----------------------------------------------------------------------------
def test_grid_marks_accepted_rejected_kept_and_discarded():
    from helpers import ScriptedModel

    from components.token_grid import grid_html
    from packed_ss.engine import decode

    prompt, target = [3, 4, 5], [6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 6, 7]
    model = ScriptedModel(prompt, target, thresholds=[0, 0, 1, 2, 3, 3, 3])
    records = list(decode(model, prompt, DecodeConfig(block_size=4, max_new_tokens=12), "packed"))
    strings = lambda ids: [f"t{i}" for i in ids]  # noqa: E731
    sequence = prompt + [t for r in records for t in r.appended]
    verifying = next(r for r in records[1:] if 0 < r.h < len(r.old_draft))
    html = grid_html(verifying, sequence, strings, model.mask_token_id, "Packed-SS")
    assert html.count('class="chip accepted"') == verifying.h
    assert 'class="chip rejected"' in html
    assert html.count('class="chip kept"') == len(verifying.kept)
    assert html.count('class="chip discarded"') == len(verifying.discarded)
    assert html.count('class="chip faded"') == len(verifying.verifier_tokens) - verifying.h - 1
    assert f"A = {len(verifying.appended)}" in html


def test_mask_folds_the_cache_into_one_band():
    from components.mask_plot import mask_codes, mask_figure, segments
    from packed_ss.layout import packed_layout, quadratic_layout

    layout = packed_layout(5, [6, 7], 3, cached=40, mask_id=1)
    codes, folded = mask_codes(layout)
    assert folded and codes.shape == (8, 9)
    assert (codes[:, 0] > 0).all()  # every row sees the cache
    assert codes[0][1 + 4] == 0 and codes[4][1] == 0  # verify and draft halves are blind to each other
    labels = [label for _, _, label in segments(quadratic_layout(5, [6], 3, cached=9, mask_id=1))]
    assert labels[0].startswith("verify") and labels[1].startswith("branch h=0") and len(labels) == 5
    figure = mask_figure([layout], lambda ids: [str(i) for i in ids])
    assert figure.layout.height and figure.data[0].type == "heatmap"


def test_cost_model_fit_recovers_tau_and_delta():
    import numpy as np

    from components.charts import cost_figure, fit_cost_model, predicted_iteration_ms

    rng = np.random.default_rng(0)
    rows = rng.integers(1, 200, size=300)
    ms = 2.0 + 0.05 * rows + rng.normal(0, 0.05, size=300)
    ms[:10] += 30  # a few calls slowed down by another process
    model = fit_cost_model(rows.tolist(), ms.tolist())
    assert abs(model.tau_ms - 2.0) < 0.2 and abs(model.delta_ms - 0.05) < 0.005
    assert predicted_iteration_ms("linear", 8, model) == pytest.approx(2 * model.call_ms(8))
    assert predicted_iteration_ms("packed", 8, model) == pytest.approx(model.call_ms(16))
    assert predicted_iteration_ms("quadratic", 8, model) == pytest.approx(model.call_ms(72))
    figure = cost_figure(model, [("packed", 7, 3.0), ("linear", 7, 4.0)])
    assert len(figure.data) == 6
    with pytest.raises(ValueError):
        fit_cost_model([8, 8], [1.0, 2.0])


def test_eager_step_run_matches_the_lazy_one(tiny_model_dir):
    """ZeroGPU mode computes the whole run in one call at the first Step; the iterations are the same."""
    from serve.gpu import GpuTasks
    from serve.models import ModelStore
    from serve.settings import make_settings
    from serve.step import StepRun

    store = ModelStore(str(tiny_model_dir), device="cpu")
    settings = make_settings("", "w1 w2 w3", "linear", 4, 0, 0, 1, 0, 9)
    lazy = StepRun(settings, store.get(""))
    eager = StepRun(settings, store.get(""), tasks=GpuTasks(store), eager=True)
    while lazy.step():
        assert eager.step()
    assert not eager.step() and eager.at_end and lazy.at_end
    assert [r.appended for r in lazy.records] == [r.appended for r in eager.records]
    eager.goto(2)
    assert eager.position == 2 and eager.summary().iterations == 2


def test_settings_validation_messages():
    from serve.errors import UserError
    from serve.settings import make_settings

    ok = make_settings("", "x", "packed", 8, 0, 0, 1, 0, 16)
    assert ok.config.block_size == 8 and ok.schedule == "packed"
    for args, message in [(("", "", "packed", 8, 0, 0, 1, 0, 16), "empty"),
                          (("", "x", "cubic", 8, 0, 0, 1, 0, 16), "unknown schedule"),
                          (("", "x", "packed", 2.5, 0, 0, 1, 0, 16), "whole number"),
                          (("", "x", "packed", 8, float("nan"), 0, 1, 0, 16), "temperature"),
                          (("", "x", "packed", 8, 0, 0, 0, 0, 16), "top-p"),
                          (("", "x", "packed", 8, 0, 0, 1, 0, 513), "cap"),
                          (("", "x", "packed", 8, 0, -1, 1, 0, 16), "top-k"),
                          (("", "x", "packed", 8, 0, 0, 1, 2**70, 16), "seed")]:
        with pytest.raises(UserError, match=message):
            make_settings(*args)


def test_the_committed_benchmark_report_is_the_default_view():
    from serve.benchmark import DEFAULT_REPORT, load_report

    markdown, figures = load_report(DEFAULT_REPORT)
    assert "Packed-SS" in markdown and figures


def test_a_taken_port_ends_with_one_line(capsys):
    import socket

    import app

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit) as stop:
            app.main(["--host", "127.0.0.1", "--port", str(port)])
    assert "cannot start the server" in str(stop.value.code) and "\n" not in str(stop.value.code)


def test_linear_ss_can_be_stepped_one_call_at_a_time(tiny_model_dir):
    """Step by call: Linear-SS's drafting call is shown before its verification (drafting waits for it)."""
    from gradio_client import Client

    import app
    from helpers import serve

    for url in serve(app.build_demo(str(tiny_model_dir), new_tokens_cap=CAP)):
        client = Client(url, verbose=False)
        client.predict("call", api_name="/step_by")
        args = ui_args(schedule="linear")
        first = client.predict(*args, api_name="/step")  # the prefill: one call, shown whole
        assert first[0]["value"] == 1 and "call 1 of 2" not in first[3]
        drafted = client.predict(*args, api_name="/step")
        assert drafted[0]["value"] == 2 and "call 1 of 2" in drafted[3] and "after call 2" in drafted[3]
        assert "Nothing is verified yet" in drafted[1] and "Call 1 (drafting)" in drafted[1]
        verified = client.predict(*args, api_name="/step")
        assert verified[0]["value"] == 2 and "call 1 of 2" not in verified[3]
        assert "call 2 (verification)" in verified[1]
        client.predict("iteration", api_name="/step_by")
        whole = client.predict(*args, api_name="/step")
        assert whole[0]["value"] == 3 and "call 1 of 2" not in whole[3]


def test_race_charts_fill_in_during_the_replay():
    from components.race_panel import race_figures
    from serve.lanes import Lane

    lane = Lane(schedule="packed", title="Packed-SS", token_ids=(1, 2, 3, 4), sources=("x",) * 4,
                wall_ms=(10.0, 20.0, 30.0), nfe=(1, 2, 3), tokens=(1, 3, 4), metrics={})
    early, _, early_path = race_figures([lane], clock_ms=15.0)
    full, wall, path = race_figures([lane])
    assert list(early_path.data[0].x) == [0, 1] and list(path.data[0].y) == [0, 1, 2, 3]  # NFE per token count
    assert list(early.data[0].y) == [0, 1] and list(full.data[0].y) == [0, 1, 3, 4]
    assert tuple(early.layout.xaxis.range) == tuple(full.layout.xaxis.range)  # axes stay put while it fills
    assert list(wall.data[0].x) == [0.0, 0.01, 0.02, 0.03]


def test_explain_log_axis_labels_in_full_and_poor_fits_are_flagged():
    from components.charts import CostModel, cost_figure, fit_summary

    figure = cost_figure(CostModel(10.0, 0.1, 20, 1, 64, 0.5), [("packed", 3, 12.0)])
    ticks = list(figure.layout.yaxis.ticktext)
    assert "20" in ticks and "50" in ticks and "2" in ticks  # 20 is "20", not a minor "2"
    assert "⚠" not in fit_summary(CostModel(10.0, 0.1, 20, 1, 64, 5.0))
    assert "⚠ The residual is 3.0× τ" in fit_summary(CostModel(10.0, 0.1, 20, 1, 64, 30.0))


def test_scripted_drafter_in_the_race_and_the_step_view(client):
    perfect = client.predict("w1 w2 w3", max_new_tokens=12, block_size=4, drafter="scripted", drafter_quality=1.0,
                             api_name="/race")
    useless = client.predict("w1 w2 w3", max_new_tokens=12, block_size=4, drafter="scripted", drafter_quality=0.0,
                             api_name="/race")
    assert perfect["lossless_identical_to_ar"] and useless["lossless_identical_to_ar"]
    for name in ("linear", "packed"):
        assert perfect["lanes"][name]["nfe"] < useless["lanes"][name]["nfe"]
        assert "scripted\u00a0drafter\u00a0q=1" in perfect["verdict"]
    assert perfect["lanes"]["packed"]["nfe"] <= perfect["lanes"]["linear"]["nfe"]  # Theorem 3.2
    step = client.predict(*ui_args(drafter="scripted", drafter_quality=0.5), api_name="/step")
    assert "scripted drafter q = 0.5" in step[1]
    client.predict(api_name="/reset")
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match="drafter quality must be from 0 to 1"):
        client.predict("w1 w2", drafter="scripted", drafter_quality=1.5, api_name="/generate")
    with pytest.raises(AppError, match="drafter must be 'model'"):
        client.predict("w1 w2", drafter="oracle", api_name="/generate")


def test_race_at_each_schedules_best_block_size(client):
    first = client.predict("w1 w2 w3", max_new_tokens=8, block_size=4, block_sizes="best", api_name="/race")
    assert "short probe on this machine" in first["block_size_source"]
    from serve.block_sizes import PROBE_BLOCK_SIZES

    for name in ("linear", "quadratic", "packed"):
        assert first["block_sizes"][name] in PROBE_BLOCK_SIZES
        assert first["lanes"][name]["block_size"] == first["block_sizes"][name]
    again = client.predict("w1 w2 w3", max_new_tokens=8, block_size=4, block_sizes="best", api_name="/race")
    assert again["block_sizes"] == first["block_sizes"]  # found once per model, then kept
    same = client.predict("w1 w2 w3", max_new_tokens=8, block_size=5, api_name="/race")
    assert {same["lanes"][n]["block_size"] for n in ("linear", "quadratic", "packed")} == {5}
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match="block_sizes must be 'same'"):
        client.predict("w1 w2 w3", max_new_tokens=8, block_sizes="fastest", api_name="/race")


def test_best_block_sizes_come_from_the_saved_benchmark_for_its_own_model():
    from serve.block_sizes import BestBlockSizes
    from conftest import EMBEDDED
    from packed_ss.models import DualModeModel

    if not (EMBEDDED / "model.safetensors").exists():
        pytest.skip("assets/model has no weights yet")
    model = DualModeModel.from_pretrained(EMBEDDED, device="cpu", dtype="float32")
    found = BestBlockSizes()
    sizes, source = found._from_report(str(EMBEDDED.resolve()), model)
    saved = json.loads(found.report.read_text())["config"]["block_sizes"]
    lanes = {"linear", "quadratic", "packed", "lookup", "packed-mixed", "partial", "diffusion"}
    assert sizes == {s: b for s, b in saved.items() if s in lanes} and "saved benchmark" in source
    assert {"linear", "quadratic", "packed"} <= set(sizes)  # every speculative lane at its own B
    model64 = DualModeModel.from_pretrained(EMBEDDED, device="cpu", dtype="float64")
    assert BestBlockSizes()._from_report(str(EMBEDDED.resolve()), model64) is None  # measured in float32 only


def test_a_race_says_whether_other_requests_computed_during_it(tiny_model_dir):
    from serve.limits import ComputeGate
    from serve.gpu import GpuTasks
    from serve.models import ModelStore
    from serve.race import run_race
    from serve.settings import make_settings
    from serve.step import StepRun

    store, gate = ModelStore(str(tiny_model_dir)), ComputeGate()
    tasks = GpuTasks(store, gate)
    settings = make_settings("", "w1 w2 w3", "packed", 4, 0, 0, 1, 0, 12)
    alone = run_race(tasks, settings)
    assert alone.interleaved == 0 and alone.to_json()["isolation"].startswith("Nothing else computed")
    # which forward ran the lanes, and their calls over the weight-read floor (measured for the race, issue 55)
    assert "Calls: the native forward, eager calls; its calls take" in alone.model_note, alone.model_note
    assert "x the floor (the larger of their arithmetic" in alone.model_note
    done = threading.Event()

    def stepping():  # another visitor stepping through a run the whole time
        while not done.is_set():
            run = StepRun(make_settings("", "w2 w3", "linear", 4, 0, 0, 1, 0, 8), store.get(""), gate=gate)
            while not done.is_set() and run.step():
                pass

    other = threading.Thread(target=stepping)
    other.start()
    try:
        shared = run_race(tasks, settings)
    finally:
        done.set()
        other.join()
    assert shared.interleaved > 0
    assert f"{shared.interleaved} iterations of other requests" in shared.to_json()["isolation"]
    assert [lane.token_ids for lane in shared.lanes] == [lane.token_ids for lane in alone.lanes]
