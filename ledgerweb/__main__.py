"""``python -m ledgerweb``: the same as the ``ledgerweb`` command."""

import sys

from ledgerweb.cli import main

sys.exit(main())
