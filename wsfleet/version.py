"""The project's version: one string for the worker, the router, the CDK constructs
and ``fleetctl``, and the package's own (pyproject.toml reads it from here).

It lives in ``wsfleet`` because that package is in every place the version is shown:
the worker image and the router's Lambda asset carry ``wsfleet`` as source, without
package metadata to ask. Semantic versioning; README.md, "Versions", says what counts
as a breaking change, and CHANGELOG.md what each version changed.
"""

from __future__ import annotations

from typing import Final

VERSION: Final = "1.0.0"
