"""`python -m gateway` is `switchboard`."""

import sys

from gateway.cli import main

sys.exit(main())
