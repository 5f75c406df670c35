"""Packed-SS as an lm-evaluation-harness model: any generation task of lm-eval, decoded by any of our schedules and
graded by lm-eval itself.

An optional extra (``pip install -r requirements-lm-eval.txt``); nothing else in the project imports it.

* :mod:`packed_ss.lmeval.model`: the model class, registered with lm-eval as ``packed-ss`` when imported.
* :mod:`packed_ss.lmeval.figures`: what each request cost (NFE, tokens/NFE, acceptance lengths, decoder time),
  per task and schedule, and the comparison with the ``ar`` schedule of the same run.
* ``python -m packed_ss.lmeval ...``: lm-eval's own command line with the model registered, e.g.
  ``python -m packed_ss.lmeval --model packed-ss --model_args schedule=packed,block_size=8 --tasks gsm8k``.
"""

MISSING = "lm-eval is not installed: pip install -r requirements-lm-eval.txt"
