"""Running generated code where it cannot reach the machine, and a verdict it cannot forge.

Nothing here knows of any task: a grader hands in the solution, the tests and the names the tests take from
the solution, and gets a :class:`Verdict` back.

Modules: :mod:`~packed_ss.sandbox.runner` (:func:`find_sandbox`, :func:`run_program`: bubblewrap, the
watchdog, the limits), :mod:`~packed_ss.sandbox.guard` (the solver and the judge, run inside the sandbox as a
script) and :mod:`~packed_ss.sandbox.names` (what a piece of Python binds and reads).
"""

from packed_ss.sandbox.names import UNPARSABLE, free_names, statement_names, top_level_names
from packed_ss.sandbox.runner import TIMEOUT_S, Sandbox, SandboxMissing, Verdict, find_sandbox, run_program

__all__ = ["TIMEOUT_S", "UNPARSABLE", "Sandbox", "SandboxMissing", "Verdict", "find_sandbox", "free_names",
           "run_program", "statement_names", "top_level_names"]
