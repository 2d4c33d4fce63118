"""``python -m hybridkv``: the same command line as ``hybridkv``."""

from __future__ import annotations

import sys

from hybridkv.cli import main

if __name__ == "__main__":
    sys.exit(main())
