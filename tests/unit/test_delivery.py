"""What a handler receives and how ``HANDLER`` is loaded: single-message and batch
handlers, and the per-message path's way of making a Delivery."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from worker.delivery import (
    BatchHandler,
    Delivery,
    Handler,
    LogHandler,
    batch_call,
    load_handler,
    make_delivery,
)
from worker.plugins import PluginError


def test_make_delivery_makes_the_same_frozen_delivery():
    made = make_delivery("c1", 4, 9, {"seq": 9}, "w1", 3)
    assert type(made) is Delivery
    assert made == Delivery("c1", 4, 9, {"seq": 9}, "w1", seq_gen=3)
    assert dataclasses.astuple(made) == ("c1", 4, 9, {"seq": 9}, "w1", 3)
    assert made.seq_gen == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.seq = 10  # type: ignore[misc]
    assert dataclasses.is_dataclass(Delivery)
    assert Delivery.__dataclass_params__.frozen


def test_a_delivery_made_without_seq_gen_is_of_the_first_stream():
    """Handlers' own tests made deliveries before ``seq_gen`` existed; they still can."""
    made = Delivery("c1", 4, 9, {"seq": 9}, "w1")
    assert made.seq_gen == 0
    assert made == make_delivery("c1", 4, 9, {"seq": 9}, "w1", 0)
    assert made != make_delivery("c1", 4, 9, {"seq": 9}, "w1", 1)


class Single:
    async def handle(self, delivery: Delivery) -> None:
        return None


class Batches:
    async def handle_batch(self, deliveries: Sequence[Delivery]) -> None:
        return None


class Both(Single, Batches):
    pass


def single_factory() -> Single:
    return Single()


def batch_factory() -> Batches:
    return Batches()


def both_factory() -> Both:
    return Both()


def test_a_handler_with_handle_batch_gets_batches():
    assert batch_call(Single()) is None
    assert batch_call(LogHandler()) is None
    batches, both = Batches(), Both()
    assert batch_call(batches) == batches.handle_batch
    assert batch_call(both) == both.handle_batch  # batches win when it has both
    assert isinstance(batches, BatchHandler)
    assert not isinstance(batches, Handler)


def test_load_handler_takes_either_kind():
    assert isinstance(load_handler(None), LogHandler)
    assert isinstance(load_handler(f"{__name__}:single_factory"), Single)
    assert isinstance(load_handler(f"{__name__}:batch_factory"), Batches)
    assert isinstance(load_handler(f"{__name__}:both_factory"), Both)
    with pytest.raises(PluginError, match="neither handle"):
        load_handler("builtins:dict")
