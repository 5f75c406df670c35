"""The race's projection onto call costs measured on a GPU (packed_ss.projection, components.race_panel): the
shipped table is read with its device and date, calls are priced by their row counts, and the page labels the
result as a projection, never as a measurement."""

import json
import re

import pytest

from components.race_panel import projection_html
from packed_ss.config import DecodeConfig
from packed_ss.engine import generate
from packed_ss.projection import CallTable, load_tables, project
from serve.lanes import lane_from_run
from serve.server import GPU_TABLES, PROJECTED, gpu_tables

from helpers import tiny_llama


def test_the_shipped_h200_tables_are_read_with_their_device_and_date():
    tables = gpu_tables()
    assert [t.model for t in tables] == list(PROJECTED)
    for table in tables:
        assert table.device == "NVIDIA H200" and table.date == "2026-12-04"
        assert table.rows[0] == 1 and table.rows[-1] == 256 and len(table.ms) == len(table.rows)
    raw = json.loads(next(GPU_TABLES.glob("gpu_check-*.json")).read_text())["per_call_cost"]["embedded_bfloat16"]
    assert tables[0].cost_ms(1) == pytest.approx(raw["by_rows"][0]["median_ms"])
    # that first check measured transformers' forward, eagerly (its file predates the "forward" field): the label
    # names it, so the page does not pass these figures off as the graph path's
    assert all(t.forward == "transformers' forward, eager" and "transformers' forward" in t.label for t in tables)


def test_a_tables_forward_comes_from_its_file(tmp_path):
    table = {"by_rows": [{"rows": 1, "median_ms": 0.5}, {"rows": 8, "median_ms": 0.6}]}
    data = {"environment": {"device_name": "GPU"},
            "per_call_cost": {"forward": "the native forward, CUDA graphs", "embedded_bfloat16": table}}
    (tmp_path / "gpu_check-gpu-2027-01-01.json").write_text(json.dumps(data))
    (found,) = load_tables(tmp_path / "gpu_check-gpu-2027-01-01.json")
    assert found.forward == "the native forward, CUDA graphs" and "CUDA graphs" in found.label


def test_calls_are_priced_by_their_rows_between_the_measured_counts():
    table = CallTable("GPU", "2026-01-01", "m", rows=(1, 4, 16), ms=(1.0, 2.0, 5.0), source="x.json")
    assert table.cost_ms(1) == 1.0 and table.cost_ms(10) == pytest.approx(3.5)  # linear between 4 and 16
    assert table.cost_ms(1000) == 5.0  # beyond the last measured count: its cost, no extrapolation
    assert project([1, 4, 16, 16], table) == pytest.approx(13.0)


def test_a_file_that_is_not_the_scripts_json_gives_no_projection(tmp_path, capsys):
    (tmp_path / "gpu_check-x-2026-01-01.json").write_text(json.dumps({"per_call_cost": {}}))
    assert gpu_tables(tmp_path) == [] and "no GPU projection" in capsys.readouterr().err
    with pytest.raises(ValueError, match="not the JSON of scripts/gpu_check.py"):
        load_tables(tmp_path / "gpu_check-x-2026-01-01.json")
    assert gpu_tables(tmp_path / "missing") == []


def test_the_page_labels_the_projection_and_prices_each_lanes_own_calls():
    model = tiny_llama(vocab_size=20, seed=2, logit_scale=3.0, eos=False)
    config = DecodeConfig(block_size=4, max_new_tokens=16)
    ar = generate(model, [4, 5, 6], config, "ar")
    packed = generate(model, [4, 5, 6], config, "packed")
    lanes = [lane_from_run(ar, "Autoregressive", None), lane_from_run(packed, "Packed-SS", ar.token_ids)]
    flat = CallTable("NVIDIA H200", "2026-12-04", "a flat model", rows=(1, 256), ms=(2.0, 2.0), source="f.json")
    text = projection_html(lanes, [flat])
    assert "Projection, not a measurement" in text and "NVIDIA H200 (2026-12-04" in text
    cells = re.findall(r"data-col='projected' data-label='[^']*'>([0-9.]+)x \(([0-9,]+)\)", text)
    assert cells[0] == ("1.00", "500")  # AR: one token per 2 ms call
    # Every call costs the same: Packed-SS's projected speed over AR's is its tokens per call over AR's.
    assert float(cells[1][0]) == pytest.approx(packed.tokens_per_nfe, abs=0.006)
    assert projection_html(lanes, []) == "" and projection_html(lanes[:1], [flat]) == ""


def _summary(estimate, low, high, ar_ms, prompts=164, tokens=128, b=6, machine="CPU A"):
    return {"meta": {"machine": machine, "created": "2026-12-04T20:00:00+00:00", "prompts_measured": prompts},
            "config": {"max_new_tokens": tokens, "block_sizes": {"packed": b}, "default_block_size": 8},
            "schedules": {"ar": {"time_per_nfe_ms": ar_ms}},
            "comparisons": [{"numerator": "packed", "denominator": "ar",
                             "throughput_ratio": {"estimate": estimate, "low": low, "high": high}}]}


def test_a_live_benchmark_that_disagrees_with_the_bundled_report_is_told_why():
    """In-app benchmarks gave Packed-SS / AR about 0.5 while the bundled report says 1.17, and nothing
    said why (issue 53)."""
    from serve.benchmark import against_bundled

    bundled = _summary(1.17, 1.10, 1.245, 3.44)
    live = _summary(0.52, 0.47, 0.58, 15.1, prompts=3, tokens=64, b=8, machine="CPU B")
    text = against_bundled(live, bundled, "docs/bench-humaneval")
    assert text.startswith("Against the bundled report `docs/bench-humaneval` (made on CPU A, 2026-12-04): "
                           "Packed-SS / AR 0.52 [0.47, 0.58] here, 1.17 [1.10, 1.25] there.")
    assert "They differ beyond both intervals: 3 prompts here against 164 there" in text
    assert "64 new tokens here against 128" in text and "Packed-SS at B = 8 here against B = 6" in text
    assert "AR's calls took 15.10 ms here against 3.44 ms there (4.4x)" in text
    agreeing = against_bundled(_summary(1.2, 1.0, 1.4, 3.5, prompts=5), bundled)
    assert agreeing.endswith("The intervals overlap: this run agrees with it.")
    assert against_bundled({"comparisons": []}, bundled) == ""
