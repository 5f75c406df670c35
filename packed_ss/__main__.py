import sys

from packed_ss.cli import main

sys.exit(main())
