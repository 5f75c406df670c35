"""Torch settings that are one per process, and the locks that keep one thread's changes of them from another's calls.

Three kinds of work here change state that every thread of the process reads:

* Loading a model. transformers' ``from_pretrained`` builds the network under ``local_torch_dtype``
  (``transformers/modeling_utils.py``, lines 219-240 in 5.23; entered by ``get_init_context``, line 3807):
  ``torch.set_default_dtype(dtype)`` while the layers are made, the old default put back on the way out. The
  default dtype is one per process, so two loads in two threads interleave: a float32 model built while another
  thread's bfloat16 load holds the default comes out with bfloat16 layers (its calls then fail with "expected m1 and
  m2 to have the same dtype, but got: float != c10::BFloat16"), and the default can stay bfloat16 once both have put
  back what they found. The same contexts swap ``PreTrainedModel.tie_weights`` for a no-op (``no_tie_weights``),
  restored the same way. :data:`LOADING` lets one load at a time run (:func:`loading`); a server's load also takes a
  turn of its compute gate (:meth:`serve.models.ModelStore.get`).
* Compiling a call. dynamo's stance (``torch.compiler.set_stance``, ``_stance`` in ``torch/_dynamo/eval_frame.py``)
  is a module global, and its ``skip_guard_eval_unsafe`` makes a compiled function trust the guards of its compiled
  variants without checking them: a call that compiles a new shape while another thread's call holds that stance
  may run a variant made for another shape. :data:`COMPILING` is held around every compile and around every use of
  that stance. (inductor's ``config.patch`` is per thread in torch 2.13.)
* Threads: torch's count is per thread, but a thread started later takes the last count set anywhere
  (:class:`packed_ss.threads.ThreadTuner` sets it at each turn of a server's compute gate).

:func:`restore_default_dtype` is the check a server makes before each model iteration: torch's default dtype is the
process's own unless a load is in progress.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

LOADING = threading.RLock()  # held while a model loads (torch's default dtype is the loaded model's meanwhile)
COMPILING = threading.RLock()  # held while a call compiles, and by a call run under dynamo's unsafe stance
DEFAULT_DTYPE = torch.get_default_dtype()  # the process's default dtype (float32 unless a script set another)


@contextmanager
def loading() -> Iterator[None]:
    """Hold :data:`LOADING` for the body: no other thread's model load runs meanwhile (loads wait for each other)."""
    with LOADING:
        yield


def restore_default_dtype() -> str | None:
    """Put torch's default dtype back to :data:`DEFAULT_DTYPE` when it differs and no model load is in progress
    (a load sets it on purpose for a while). Returns one line saying what was found, or None when nothing was
    changed."""
    if not LOADING.acquire(blocking=False):
        return None
    try:
        found = torch.get_default_dtype()
        if found == DEFAULT_DTYPE:
            return None
        torch.set_default_dtype(DEFAULT_DTYPE)
        return (f"torch's default dtype was {str(found).removeprefix('torch.')} with no model loading; "
                f"set back to {str(DEFAULT_DTYPE).removeprefix('torch.')}")
    finally:
        LOADING.release()
