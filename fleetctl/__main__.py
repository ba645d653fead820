"""``python -m fleetctl``."""

from __future__ import annotations

import sys

from fleetctl.cli import main

if __name__ == "__main__":
    sys.exit(main())
