"""Loading ``module:factory`` plug-ins named in the environment."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


class PluginError(ValueError):
    """A plug-in spec that does not name a callable factory."""


def import_factory(spec: str, *, setting: str) -> Callable[[], Any]:
    """Import ``package.module:factory`` and return the factory, not called. Errors
    name the setting so the operator knows what to fix."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise PluginError(f"{setting} must look like 'package.module:factory', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise PluginError(f"{setting}: cannot import {module_name!r}: {error}") from error
    except Exception as error:
        # A module that fails while it runs (a syntax error, a missing setting of its
        # own) is as unusable as a missing one: named, not a traceback.
        raise PluginError(
            f"{setting}: importing {module_name!r} failed: {type(error).__name__}: {error}"
        ) from error
    factory: Callable[[], Any] | None = getattr(module, attr, None)
    if not callable(factory):
        raise PluginError(f"{setting}: {module_name}.{attr} is not a callable factory")
    return factory


def load_factory(spec: str, *, setting: str) -> Any:
    """Import ``package.module:factory``, call the factory with no arguments once and
    return what it made."""
    return import_factory(spec, setting=setting)()
