"""``python -m packed_ss.bench``: the benchmark's command line (:mod:`packed_ss.bench.cli`)."""

import sys

from packed_ss.bench.cli import main

sys.exit(main())
