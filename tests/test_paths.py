"""Eager against compiled calls and the machine's limits (packed_ss.cost.roofline, components.paths, the
Explain tab's task)."""

import threading
import time
import warnings

import torch
from helpers import tiny_llama

from components.paths import paths_figure, paths_summary
from packed_ss.cost import CallCost, roofline
from serve.gpu import GpuTasks
from serve.models import ModelStore


def test_roofline_counts_every_weight_matrix_but_the_embeddings_and_bounds_a_call_below():
    model = tiny_llama(vocab_size=24, hidden=32, layers=2)
    roof = roofline(model, repeats=2)
    matrices = sum(p.numel() for n, p in model.model.named_parameters() if p.dim() == 2 and "embed_tokens" not in n)
    assert roof.flops_per_row == 2 * matrices and roof.weight_bytes == matrices * 8  # float64
    assert roof.gflops > 0 and roof.read_gbs > 0
    assert roof.ms(1) == max(roof.compute_ms_per_row, roof.read_ms) and roof.ms(10 ** 6) > roof.ms(1)
    assert roofline(model) is roof  # measured once per network


def test_roofline_counts_a_head_tied_to_the_embeddings_once_and_caps_its_probe():
    """A tied head is the embedding matrix, which the old filter dropped, so the floor of a
    tied checkpoint left out its largest read. The probe buffer is capped (an 8B model's weights are not allocated
    twice) and out of memory is one ValueError (the CLI then reports no floor and keeps its run)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from packed_ss.cost import READ_BUFFER_BYTES, read_elements

    untied = tiny_llama(vocab_size=24, hidden=32, layers=2)
    config = LlamaConfig(**{**untied.model.config.to_dict(), "tie_word_embeddings": True})
    tied = LlamaForCausalLM(config).double().eval()
    assert tied.get_output_embeddings().weight is tied.get_input_embeddings().weight
    want = roofline(untied, repeats=1).weight_bytes  # the head is a matrix of its own there, the same size

    class Holder:
        model = tied

    assert roofline(Holder(), repeats=1).weight_bytes == want
    assert read_elements(10, 2) == 1 << 20 and read_elements(1 << 24, 2) == 1 << 24
    assert read_elements(8 * 10**9, 2) * 2 == READ_BUFFER_BYTES


def test_roofline_out_of_memory_is_one_value_error_and_the_cli_keeps_its_run(monkeypatch, tiny_model_dir, capsys):
    import json

    import pytest

    from packed_ss import cost
    from packed_ss.cli import main

    def short_of_memory(*args, **kwargs):  # where the probe sizes its buffer, inside the measurement
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 16.00 GiB")

    def cpu_allocator_fails(*args, **kwargs):  # what the CPU allocator raises: no OutOfMemoryError there
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")

    for failure in (cpu_allocator_fails, short_of_memory):
        monkeypatch.setattr(cost, "read_elements", failure)
        with pytest.raises(ValueError, match="no cpu memory left"):
            roofline(tiny_llama(), repeats=1)
    code = main(["generate", "--model", str(tiny_model_dir), "--prompt", "w1 w2", "--max-new-tokens", "3",
                 "--json", "--threads", "1"])
    out = capsys.readouterr().out
    assert code == 0 and json.loads(out)["floor"] is None and json.loads(out)["nfe"] >= 1


def test_paths_chart_and_text_show_both_fits_and_the_limit():
    model = tiny_llama()
    roof = roofline(model, repeats=1)
    eager, compiled = CallCost(2.0, 0.08), CallCost(0.5, 0.07)
    figure = paths_figure(eager, compiled, roof)
    assert [t.name for t in figure.data] == ["eager calls (fit, 1-192 rows measured)",
                                             "compiled calls (fit, 1-48 rows measured)",
                                             "compiled calls beyond 48 rows (extrapolated, never below the limit)",
                                             "machine limit"]
    assert figure.data[1].y[0] == compiled.ms(1)
    text = paths_summary(eager, compiled, roof)
    assert "| eager | 2.000 | 0.0800 | 2.080 |" in text and "| compiled | 0.500 | 0.0700 | 0.570 |" in text
    assert "Compute limit" in text and "Weight-read limit" in text and "datasheet" not in text
    from packed_ss.cost import Roofline

    known = Roofline(flops_per_row=1e9, weight_bytes=2e9, gflops=600_000.0, read_gbs=4000.0, spec_gflops=989_000.0,
                     spec_read_gbs=4800.0)
    text = paths_summary(eager, compiled, known)
    assert "600000 GFLOP/s a large matrix product reaches here (datasheet: 989,000)" in text
    assert "4000 GB/s measured here (datasheet: 4,800)" in text and "the read up to about 300 rows" in text
    assert "No compiled fit: torch.compile failed" in paths_summary(eager, None, roof, "torch.compile failed (x)")


def test_an_extrapolated_fit_is_never_drawn_below_the_machine_limit():
    """Explain drew the compiled fit below its own "machine limit" line at 32-128 rows while saying no call can be
    faster than the limit (issue 53)."""
    from packed_ss.cost import Roofline

    roof = Roofline(flops_per_row=1e8, gflops=1000.0, weight_bytes=1e6, read_gbs=100.0)  # 0.1 ms per row
    compiled = CallCost(5.0, 0.01)  # above the limit up to the 48 rows measured, below it far beyond them
    figure = paths_figure(None, compiled, roof)
    limit = {x: y for x, y in zip(figure.data[-1].x, figure.data[-1].y)}
    beyond = figure.data[1]
    assert beyond.line.dash == "dot" and list(beyond.x) == [32, 64, 128]
    assert all(y >= limit[x] for x, y in zip(beyond.x, beyond.y) if x in limit)


def test_a_limit_that_measured_calls_beat_is_drawn_and_said_as_beaten():
    """Explain drew the compiled fit (0.0997 ms per row, about 7 ms at 32 rows) below the dashed machine limit
    (about 13.5 ms at 32 rows) under "A call cannot be faster than the larger of the two"."""
    from components.paths import beaten_limits, limit_sentence
    from packed_ss.cost import Roofline

    roof = Roofline(flops_per_row=4.219e8, gflops=1000.0, weight_bytes=1e8, read_gbs=100.0)  # 0.42 ms per row
    eager, compiled = CallCost(20.0, 0.5), CallCost(3.8, 0.0997)
    beaten = beaten_limits(eager, compiled, roof)
    assert {b.path for b in beaten} == {"compiled"} and 32 in {b.rows for b in beaten}
    assert all(b.fit_ms < b.limit_ms for b in beaten)
    text = paths_summary(eager, compiled, roof)
    assert "cannot be faster" not in text and "⚠ Measured compiled calls beat this limit" in text
    assert limit_sentence(beaten, roof) in text and "\n" not in limit_sentence(beaten, roof)
    figure = paths_figure(eager, compiled, roof)
    assert figure.data[-1].name.startswith("machine limit as probed (beaten")
    beyond = next(t for t in figure.data if t.name.startswith("compiled calls beyond"))
    assert list(beyond.y) == [compiled.ms(r) for r in beyond.x]  # not raised to a limit the measurements beat
    # A limit no measured point beats is said to be one, and drawn as one
    held = Roofline(flops_per_row=1e7, gflops=1000.0, weight_bytes=1e8, read_gbs=100.0)  # 0.01 ms per row, 1 ms read
    assert beaten_limits(eager, compiled, held) == ()
    assert "A call cannot be faster than the larger of the two" in paths_summary(eager, compiled, held)
    assert paths_figure(eager, compiled, held).data[-1].name == "machine limit"


def test_the_floor_is_the_larger_of_arithmetic_and_the_weight_read_on_both_sides_of_the_crossover():
    """Issue 64: the floor of a call of R rows is max(R x arithmetic per row, one read of the weights); the CLI's
    ratios over the floor divided every call by the read alone, so a call of many rows on a device that reads fast
    seemed far above a floor it could not reach."""
    from packed_ss import DecodeConfig, generate
    from packed_ss.cli import call_floor
    from packed_ss.cost import Roofline

    roof = Roofline(flops_per_row=1e9, weight_bytes=2e9, gflops=2000.0, read_gbs=1000.0)  # 0.5 ms per row, 2 ms read
    assert roof.compute_ms_per_row == 0.5 and roof.read_ms == 2.0 and roof.crossover_rows == 4.0
    assert roof.ms(1) == 2.0 and roof.ms(4) == 2.0 and roof.ms(8) == 4.0 and roof.ms(256) == 128.0
    assert roof.over(6.0, 1) == 3.0 and roof.over(6.0, 8) == 1.5  # the same time, either side of the crossover
    model = tiny_llama(seed=1)
    model.model.roofline_fit = Roofline(flops_per_row=1e9, weight_bytes=1e6, gflops=2000.0, read_gbs=1.0)
    run = generate(model, [3, 4, 5, 6, 7, 8, 9, 10], DecodeConfig(block_size=4, max_new_tokens=4), "ar")
    floor = call_floor(model, run)
    calls = [call for record in run.records for call in record.calls]
    assert floor["rows_per_call"][0] == 8 and 1 in floor["rows_per_call"]  # the prefill above the crossover (2 rows)
    want = [round(call.model_ms / max(0.5 * call.layout.rows, 1.0), 2) for call in calls]
    assert floor["over_floor_per_call"] == want and floor["crossover_rows"] == 2.0 and floor["floor_ms"] == 1.0


def test_the_probes_are_timed_with_cuda_events_on_cuda_and_the_host_clock_elsewhere(monkeypatch):
    """A 1024^3 product on an H100 is 3-5 us of work against 15-25 us of launch and synchronisation: the host clock
    read its GFLOP/s 4-8x low. CUDA events time the device's work; a CPU's host clock is its own."""
    from types import SimpleNamespace

    from packed_ss import cost

    assert cost.probe_timer(SimpleNamespace(type="cuda")) is cost.cuda_event_seconds
    assert cost.probe_timer(torch.device("cpu")) is cost.host_seconds
    timed = []

    def fixed(fn, repeats, runs, device):  # every probe "takes" 2 ms: the figures follow from the sizes alone
        timed.append((repeats, runs, device.type))
        return 0.002

    monkeypatch.setattr(cost, "probe_timer", lambda device: fixed)
    model = tiny_llama(vocab_size=24, hidden=32, layers=2)
    roof = roofline(model, repeats=3)
    sizes = cost.probe_sizes("cpu", roof.weight_bytes // 8, 8, None)
    assert timed == [(3, 1, "cpu"), (3, 1, "cpu")]
    assert roof.gflops == 2 * sizes.gemm_side ** 3 / 0.002 / 1e9
    assert roof.read_gbs == sizes.read_elements * 8 / 0.002 / 1e9
    assert roof.spec_gflops is None and roof.spec_read_gbs is None  # a CPU is in no datasheet table


def test_the_probes_are_sized_within_the_free_memory_and_past_the_l2():
    """On CUDA the product is 8192^3 and the read 4 GiB, whatever the model's size (a 20 MB model's read measured
    the L2), each within half the free memory; where not even a read of 4x the L2 fits, one ValueError."""
    import pytest

    from packed_ss.cost import CUDA_READ_BYTES, ProbeSizes, probe_sizes

    gib, mib = 1 << 30, 1 << 20
    assert probe_sizes("cuda", 10 ** 7, 2, 60 * gib, 50 * mib) == ProbeSizes(8192, CUDA_READ_BYTES // 2, 10)
    for free in (60 * gib, 1 * gib, 300 * mib):
        for size in (2, 4):
            found = probe_sizes("cuda", 10 ** 7, size, free, 16 * mib)
            assert 3 * found.gemm_side ** 2 * size <= free / 2 and found.read_elements * size <= free / 2
            assert found.read_elements * size >= 4 * 16 * mib and found.runs > 1
    assert probe_sizes("cuda", 10 ** 7, 2, 300 * mib, 16 * mib).gemm_side == 4096
    assert probe_sizes("cuda", 10 ** 7, 8, 60 * gib, 50 * mib).gemm_side == 2048  # float64: slow on most devices
    with pytest.raises(ValueError, match="no cuda memory left"):
        probe_sizes("cuda", 10 ** 7, 2, 300 * mib, 50 * mib)  # 150 MiB to spare: less than 4x a 50 MB L2
    assert probe_sizes("cpu", 10, 8, None) == ProbeSizes(1024, 1 << 20, 1)  # the weights' size, at least 1 Mi
    assert probe_sizes("cpu", 10 ** 9, 2, 1 * gib).read_elements * 2 == 512 * mib
    with pytest.raises(ValueError, match="no cpu memory left"):
        probe_sizes("cpu", 10 ** 9, 8, 4 * mib)


def test_the_datasheet_peaks_are_found_by_the_devices_whole_name():
    from packed_ss.cost import spec_peak

    assert spec_peak("NVIDIA H100 80GB HBM3").memory_gbs == 3350 and spec_peak("NVIDIA H100 PCIe").memory_gbs == 2000
    assert spec_peak("NVIDIA H200").memory_gbs == 4800 and spec_peak("NVIDIA H200").tflops_bf16 == 989
    assert spec_peak("NVIDIA L4").tflops_bf16 == 121 and spec_peak("NVIDIA L40S").tflops_bf16 == 362
    assert spec_peak("NVIDIA A100-SXM4-80GB").memory_gbs == 2039
    assert spec_peak("NVIDIA A100-PCIE-40GB").memory_gbs == 1555
    assert spec_peak("NVIDIA A10G").memory_gbs == 600
    assert spec_peak("NVIDIA L40") is None and spec_peak("NVIDIA GH200 480GB") is None and spec_peak("cpu") is None


def broken_compile(fn, **options):
    """torch.compile on a machine without a C++ compiler: the compiled call fails when first run."""
    def run(*args, **kwargs):
        raise RuntimeError("no C++ compiler")
    return run


def test_the_explain_task_fits_eager_calls_and_says_why_compiled_ones_failed(tiny_model_dir, monkeypatch):
    monkeypatch.setattr(torch, "compile", broken_compile)
    tasks = GpuTasks(ModelStore(str(tiny_model_dir), device="cpu"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = tasks.paths((str(tiny_model_dir), "float32"))
    assert isinstance(found["eager"], CallCost) and found["compiled"] is None
    assert "no C++ compiler" in found["note"] and found["roofline"].gflops > 0


def test_the_explain_fit_says_which_stage_it_is_at_on_the_page(tiny_model_dir, monkeypatch):
    """The button took 343 s with only an elapsed-time counter (issue 30): each stage is named as it starts, and
    the page's event (which takes Gradio's progress tracker beside the settings) answers with both fits."""
    import app
    from helpers import page_event, serve

    monkeypatch.setattr(torch, "compile", broken_compile)
    tasks = GpuTasks(ModelStore(str(tiny_model_dir), device="cpu"))
    stages = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tasks.paths((str(tiny_model_dir), "float32"), lambda done, label: stages.append((done, label)))
    assert [done for done, _ in stages] == [0, 1, 2]
    assert "eager" in stages[0][1] and "compiling" in stages[1][1] and "limits" in stages[2][1]
    for url in serve(app.build_demo(str(tiny_model_dir))):
        values = ["", "w1 w2 w3", "packed", 4, 0, 0, 1, 0, 8, False, "", "model", 0.8, "ltr", False]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kind, outputs = page_event(url, "on_paths", values)
        assert kind == "complete" and "no C++ compiler" in str(outputs[1]), outputs
        kind, outputs = page_event(url, "on_explain", [8])  # Explain says which calls its fit rests on
        assert kind == "complete" and "the same calls as the Race tab's: this server's calls (eager)" in outputs[1]


def held_compile(monkeypatch):
    """Stand-in for a long compile: the background's warm-up calls block until the returned event is set (the
    probe's timed calls then run eagerly: torch.compile fails at once). Returns (started, release)."""
    import serve.gpu

    started, release = threading.Event(), threading.Event()

    def warm(adapter):
        started.set()
        assert release.wait(120), "the test never released the compile"

    monkeypatch.setattr(torch, "compile", broken_compile)
    monkeypatch.setattr(serve.gpu, "warm_probe", warm)
    return started, release


def test_the_compiled_fit_answers_at_its_time_limit_and_finds_the_compile_done_later(tiny_model_dir, monkeypatch):
    """The fit held the compute gate for 207 s and had no time limit (issue 35): the compile now runs in the
    background, the request answers at its deadline with the eager fit and a note, and a later press gets both."""
    started, release = held_compile(monkeypatch)
    tasks = GpuTasks(ModelStore(str(tiny_model_dir), device="cpu"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = tasks.paths((str(tiny_model_dir), "float32"), None, time.monotonic() + 0.5)
        assert started.is_set() and found["compiling"] and found["compiled"] is None
        assert "still compiling in the background" in found["note"] and isinstance(found["eager"], CallCost)
        release.set()
        again = tasks.paths((str(tiny_model_dir), "float32"), None, time.monotonic() + 60)
    assert not again["compiling"] and "no C++ compiler" in again["note"]  # the compile's outcome, not a wait


def test_short_requests_are_answered_while_the_fit_compiles(tiny_model_dir, monkeypatch):
    """30 four-token /generate calls sent during the fit took median 178.8 s: now one is answered while the compile
    is still going on (it cannot end before the test releases it)."""
    import app
    from gradio_client import Client
    from helpers import page_event, serve

    started, release = held_compile(monkeypatch)
    for url in serve(app.build_demo(str(tiny_model_dir))):
        answers = []
        values = ["", "w1 w2 w3", "packed", 4, 0, 0, 1, 0, 8, False, "", "model", 0.8, "ltr", False]
        fit = threading.Thread(target=lambda: answers.append(page_event(url, "on_paths", values)))
        fit.start()
        try:
            assert started.wait(60), "the compile never started"
            result = Client(url, verbose=False).predict("w1 w2 w3", max_new_tokens=4, block_size=4,
                                                        api_name="/generate")
            assert 1 <= result["tokens"] <= 4 and not release.is_set()
        finally:
            release.set()
            fit.join(120)
        kind, outputs = answers[0]
        assert kind == "complete" and ("no C++ compiler" in str(outputs[1]) or "still compiling" in str(outputs[1]))
