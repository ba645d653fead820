"""``python -m local_stack``: the whole system on this machine; see :mod:`local_stack.runner`."""

from __future__ import annotations

from local_stack.runner import main

if __name__ == "__main__":
    raise SystemExit(main())
