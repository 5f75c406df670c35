"""Benchmark: paired throughput comparisons with bootstrap intervals, timing decomposition, block-size probe.

``python -m packed_ss.bench --prompts humaneval --limit 20 --out bench-out`` runs every prompt through
every schedule, the order of the schedules rotating from one prompt (and sample) to the next so that a
drift of the machine's speed falls on all of them alike. Prompts are tokenised and the model loaded
before any timing; decoder wall time is the engine's (sum of iteration times: model time plus non-model
decoder time, paper E.5). One untimed warm-up run per schedule precedes the measurements.

Outputs in ``--out``: ``examples.csv`` (one row per run), ``probe.csv`` (with ``--probe-block-sizes``),
``summary.json``, ``summary.md`` and ``report.html`` (plotly.js embedded once, works offline; ``--plotlyjs cdn``
links it instead). An interrupt (Ctrl-C) stops the measurements and writes what was measured so far.

Modules: :mod:`~packed_ss.bench.plan` (what to measure, prompts, run order), :mod:`~packed_ss.bench.run`
(:func:`~packed_ss.bench.run.run_benchmark` -> :class:`~packed_ss.bench.run.BenchResult`, timed through
:mod:`packed_ss.measure`), :mod:`~packed_ss.bench.summary` (statistics, lossless check; pure),
:mod:`~packed_ss.bench.report` (markdown, HTML, figures), :mod:`~packed_ss.bench.files` (the output folder:
one run at a time, earlier results set aside, files written whole), :mod:`~packed_ss.bench.palette` (each
schedule's colour and symbol in every chart) and :mod:`~packed_ss.bench.cli`.

The paper's tasks, graded beside speed, are :mod:`packed_ss.evals` (``--task``, the same flags); the sandbox
generated code runs in is :mod:`packed_ss.sandbox`.
"""
