"""The evaluation harness: the paper's tasks decoded by every schedule, graded as the field grades them, with
accuracy set beside speed (Section 4, Appendix E).

``python -m packed_ss.bench --task humaneval,gsm8k --out runs`` runs it (the benchmark's flags, the task's
defaults: :mod:`packed_ss.evals.cli`).

Modules:

- :mod:`~packed_ss.evals.tasks`: one module per task (data, prompt, cap, stops, extraction, grader, metric)
  and the registry; adding a task is adding a module there.
- :mod:`~packed_ss.evals.task`: what a task is (:class:`~packed_ss.evals.task.Task`), reading and checking
  its records, the end markers a response is cut at.
- :mod:`~packed_ss.evals.code` and :mod:`~packed_ss.evals.maths`: what the code tasks and the mathematics
  tasks share (code extraction; math-verify).
- :mod:`~packed_ss.evals.harness`: the runs, sharded over processes and resumable, then graded.
- :mod:`~packed_ss.evals.accuracy`: pass@k, accuracy and its intervals (pure).
- :mod:`~packed_ss.evals.paper`: the paper-style tables and report.

Timing comes from :mod:`packed_ss.bench` (the throughput benchmark); generated code runs in
:mod:`packed_ss.sandbox`.
"""
