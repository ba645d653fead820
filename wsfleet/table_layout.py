"""The connection table's key and global secondary indexes (docs/DESIGN.md §2), as
plain data.

``local_stack.resources`` creates the table from it and the CDK stack
(``stacks.connection_table``) builds the same one, so a local table and a deployed one
cannot differ. Names come from ``wsfleet.schema``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

from wsfleet import schema

KEY_ATTRIBUTE_TYPE: Final = "S"
"""Every attribute in a key of the table or of an index is a string."""
TABLE_KEY: Final = (schema.PARTITION_KEY, schema.SORT_KEY)
"""HASH, RANGE."""


@dataclass(frozen=True, slots=True)
class IndexLayout:
    """One global secondary index: partition (HASH) and sort (RANGE) key, and the
    attributes projected besides the keys (none: keys only)."""

    name: str
    partition_key: str
    sort_key: str
    non_key_attributes: tuple[str, ...] = ()

    @property
    def projection_type(self) -> Literal["KEYS_ONLY", "INCLUDE"]:
        return "INCLUDE" if self.non_key_attributes else "KEYS_ONLY"

    def create_table_entry(self) -> dict[str, Any]:
        """The index as one entry of CreateTable's ``GlobalSecondaryIndexes``."""
        projection: dict[str, Any] = {"ProjectionType": self.projection_type}
        if self.non_key_attributes:
            projection["NonKeyAttributes"] = list(self.non_key_attributes)
        return {
            "IndexName": self.name,
            "KeySchema": [
                {"AttributeName": self.partition_key, "KeyType": "HASH"},
                {"AttributeName": self.sort_key, "KeyType": "RANGE"},
            ],
            "Projection": projection,
        }


INDEXES: Final = (
    IndexLayout(schema.STATE_INDEX_NAME, schema.STATE_INDEX_PARTITION_KEY, schema.PARTITION_KEY),
    IndexLayout(
        schema.OWNER_INDEX_NAME,
        schema.OWNER_KEY,
        schema.PARTITION_KEY,
        non_key_attributes=schema.OWNER_INDEX_PROJECTION,
    ),
    IndexLayout(schema.UNOWNED_INDEX_NAME, schema.FREE_SHARD, schema.PARTITION_KEY),
)
"""``by-desired-state`` (the router's listing), ``by-owner`` (a session's connections,
for a takeover) and ``unowned`` (sparse: connections waiting for an owner)."""


def key_attributes() -> tuple[str, ...]:
    """Every attribute in a key of the table or of an index, once each, in order: the
    ``AttributeDefinitions`` of the table (all of type ``KEY_ATTRIBUTE_TYPE``)."""
    names = [*TABLE_KEY]
    for index in INDEXES:
        names += [index.partition_key, index.sort_key]
    return tuple(dict.fromkeys(names))
