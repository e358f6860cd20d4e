"""``python -m ledgerweb_client.mcp_gateway --config gateway.toml``."""

import sys

from . import main

sys.exit(main())
