"""``python -m bench``: see :mod:`bench.run` and ``docs/benchmarks.md``."""

import sys

from bench.run import main

sys.exit(main())
