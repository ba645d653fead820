"""The plug-in protocols a worker has by name (``UPSTREAM_PROTOCOLS``), and which
protocol each connection speaks (docs/PROTOCOLS.md, "The plug-in interface").

Every registered factory is imported and called once when the worker starts, so a
registry that cannot work stops the worker there (exit status 2, the message naming
the entry). Each connection runner then gets an instance of its own: ``factory()``,
then ``configure(options)`` when the plug-in has it, with the options of the
connection's spec. A plug-in that fails there (its factory raises, or it refuses its
options) costs that connection only: it parks with the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from worker.plugins import PluginError, import_factory
from worker.upstream_protocol import (
    DEFAULT_MAX_MESSAGE_BYTES,
    UpstreamProtocol,
    from_spec,
    load_protocol,
)
from wsfleet import protocol_specs
from wsfleet.protocol_registry import UPSTREAM_PROTOCOLS

Factory = Callable[[], Any]


class PluginSetupError(Exception):
    """A registered plug-in could not be made or configured for one connection; the
    message is the reason that connection parks with."""


@dataclass(frozen=True, slots=True)
class ProtocolPlugins:
    """The registered plug-ins' factories, by name."""

    factories: Mapping[str, Factory] = field(default_factory=dict)
    default: str | None = None
    """The registered protocol ``UPSTREAM_PROTOCOL`` names, if it names one: then a
    connection without a spec gets an instance of its own of it."""

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.factories)

    def make(self, name: str, options: Mapping[str, Any]) -> UpstreamProtocol:
        """A fresh instance of plug-in ``name``, configured with ``options``; raises
        :class:`PluginSetupError`."""
        try:
            protocol = self.factories[name]()
        except Exception as error:
            raise PluginSetupError(
                f"protocol {name!r}: its factory failed: {_text(error)}"
            ) from None
        if not isinstance(protocol, UpstreamProtocol):
            raise PluginSetupError(
                f"protocol {name!r}: its factory made a {type(protocol).__name__}, not a protocol"
            )
        configure = getattr(protocol, "configure", None)
        if configure is not None:
            try:
                configure(dict(options))
            except Exception as error:
                # The options come from the start request, never from a secret: the
                # plug-in's own words are the most useful reason.
                raise PluginSetupError(
                    f"protocol {name!r} refused its options: {_text(error)}"
                ) from None
        return protocol


NO_PLUGINS = ProtocolPlugins()


def load_plugins(registry: Mapping[str, str], default: str = "json-seq") -> ProtocolPlugins:
    """Import every factory of ``registry`` and call each once: one that cannot be
    imported, raises, or makes no protocol raises :class:`PluginError` naming it.
    ``default``: ``UPSTREAM_PROTOCOL``."""
    factories: dict[str, Factory] = {}
    for name, spec in sorted(registry.items()):
        setting = f"{UPSTREAM_PROTOCOLS} {name!r}"
        factory = import_factory(spec, setting=setting)
        try:
            made = factory()
        except Exception as error:
            raise PluginError(f"{setting}: {spec}() failed: {_text(error)}") from error
        if not isinstance(made, UpstreamProtocol):
            raise PluginError(f"{setting}: {spec}() made {made!r}, not a protocol")
        factories[name] = factory
    return ProtocolPlugins(factories, default if default in factories else None)


def default_protocol(setting: str, plugins: ProtocolPlugins) -> UpstreamProtocol:
    """The protocol ``UPSTREAM_PROTOCOL`` names, checked at start: a registered one
    must take empty options, since connections without a spec give it none."""
    if setting not in plugins.factories:
        return load_protocol(setting)
    try:
        return plugins.make(setting, {})
    except PluginSetupError as error:
        raise PluginError(f"UPSTREAM_PROTOCOL: {error}") from None


def connection_protocol(
    stored: str | None,
    default: UpstreamProtocol,
    plugins: ProtocolPlugins = NO_PLUGINS,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> UpstreamProtocol:
    """The protocol of a connection whose item stores ``stored``: a built-in or a
    registered plug-in its spec names, else the worker's default (``default``, or a
    fresh instance of the registered one ``UPSTREAM_PROTOCOL`` names). Raises
    :class:`~wsfleet.protocol_specs.InvalidProtocolError` for a spec that does not
    validate or names a protocol this worker does not have, and
    :class:`PluginSetupError`."""
    spec = protocol_specs.spec_from_item(stored, plugins=plugins.names)
    if spec is None:
        return default if plugins.default is None else plugins.make(plugins.default, {})
    if spec.name in plugins.factories:
        return plugins.make(spec.name, spec.options)
    return from_spec(spec, max_message_bytes)


def _text(error: Exception) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
