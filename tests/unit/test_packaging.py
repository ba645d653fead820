"""What `pip install <checkout>` installs is listed by hand in pyproject.toml (the
worker and the router are mapped into websocket_fleet/_bundle): every package of the
checkout must be there, or the installed worker image would miss it."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INSTALLED = {
    "websocket_fleet": "websocket_fleet",
    "wsfleet": "wsfleet",
    "fleetctl": "fleetctl",
    "worker": "websocket_fleet._bundle.worker",
    "lambdas": "websocket_fleet._bundle.lambdas",
}


def packages_in(folder: str) -> set[str]:
    return {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / folder).rglob("__init__.py")
        if "__pycache__" not in init.parts
    }


def test_every_package_of_the_checkout_is_installed() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    expected = {
        name.replace(folder, installed_as, 1)
        for folder, installed_as in INSTALLED.items()
        for name in packages_in(folder)
    }
    assert listed == expected
    assert setuptools["package-dir"] == {
        "websocket_fleet._bundle.worker": "worker",
        "websocket_fleet._bundle.lambdas": "lambdas",
    }


def test_the_worker_files_that_are_not_python_are_installed() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    data = set(setuptools["package-data"]["websocket_fleet._bundle.worker"])
    others = {
        p.name
        for p in (ROOT / "worker").iterdir()
        if p.is_file() and p.suffix not in (".py", ".pyc")
    }
    assert others == data
