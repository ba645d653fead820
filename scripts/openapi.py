"""Write the router's OpenAPI document, generated from the code, to docs/openapi.json.

    .venv/bin/python scripts/openapi.py            # (re)write docs/openapi.json
    .venv/bin/python scripts/openapi.py --check    # exit 1 if the file is out of date

The version is the project's (``wsfleet.version``, which pyproject.toml reads); routes,
parameters, bodies and answers come from ``lambdas/router/http_api.py`` through Powertools.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = REPO_ROOT / "docs" / "openapi.json"

if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


def project_version() -> str:
    from wsfleet.version import VERSION

    return VERSION


def render() -> str:
    """The document as committed: indented JSON with a final newline."""
    from lambdas.router.http_api import openapi_document

    return json.dumps(openapi_document(project_version()), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="compare instead of writing; exit 1 on a difference"
    )
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="%(default)s")
    args = parser.parse_args(argv)
    expected = render()
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current == expected:
            print(f"{args.output} is up to date")
            return 0
        diff = difflib.unified_diff(
            current.splitlines(keepends=True),
            expected.splitlines(keepends=True),
            fromfile=f"{args.output} (committed)",
            tofile="generated from the code",
            n=2,
        )
        sys.stdout.writelines(list(diff)[:80])
        print(f"\n{args.output} is out of date: run .venv/bin/python scripts/openapi.py")
        return 1
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(expected)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
