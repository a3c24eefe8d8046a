"""`python -m bench` runs every benchmark and writes bench/results/<date>.md and .png."""

import sys

from bench.run import main

sys.exit(main())
