"""``python -m packed_ss.lmeval ...``: lm-eval's own command line with the ``packed-ss`` model registered.

Every argument is lm-eval's (``lm-eval run --help``). With ``--model packed-ss`` and ``--output_path OUT``, the
decoding figures go to ``OUT/packed-ss-decoding/`` unless ``--model_args`` names ``figures=``. A model argument or
request packed-ss cannot honour, and a missing lm-eval, are one line on stderr and exit status 2.
"""

from __future__ import annotations

import json
import sys

import packed_ss  # noqa: F401  (before torch: bounded OpenMP spin, packed_ss.threads)
from packed_ss.lmeval import MISSING

FIGURES = "packed-ss-decoding"


def with_figures(argv: list[str]) -> list[str]:
    """``argv`` with ``figures=OUTPUT_PATH/packed-ss-decoding`` added to ``--model_args`` when the model is
    packed-ss, an output path is given and the arguments name no ``figures`` of their own."""
    def value(flag):
        for i, arg in enumerate(argv):
            if arg == flag and i + 1 < len(argv):
                return i + 1, argv[i + 1]
            if arg.startswith(flag + "="):
                return i, arg.split("=", 1)[1]
        return None, None

    _, model = value("--model")
    _, out = value("--output_path")
    if model != "packed-ss" or not out:
        return argv
    figures = f"{out.rstrip('/')}/{FIGURES}"
    at, args = value("--model_args")
    if at is None:
        return argv + ["--model_args", f"figures={figures}"]
    if args.lstrip().startswith("{"):
        parsed = json.loads(args)
        if "figures" in parsed:
            return argv
        merged = json.dumps({**parsed, "figures": figures})
    else:
        if any(part.split("=", 1)[0].strip() == "figures" for part in args.split(",")):
            return argv
        merged = f"{args},figures={figures}" if args.strip() else f"figures={figures}"
    out_argv = list(argv)
    out_argv[at] = merged if out_argv[at] == args else f"--model_args={merged}"
    return out_argv


def main() -> int:
    try:
        from lm_eval.__main__ import cli_evaluate
    except ImportError:
        print(f"error: {MISSING}", file=sys.stderr)
        return 2
    from packed_ss.lmeval.model import ModelArgumentError  # registers packed-ss

    sys.argv = [sys.argv[0]] + with_figures(sys.argv[1:])
    try:
        cli_evaluate()
    except (ModelArgumentError, ValueError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"error: {first}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
