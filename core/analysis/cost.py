"""Cost-performance: every formula in one place, prices never silently defaulted.

With ``ips`` images/sec measured on an instance billed ``price`` per hour:

- images per dollar      = ips * 3600 / price
- hours per epoch        = IMAGENET_EPOCH_IMAGES / ips / 3600
- cost per epoch         = hours per epoch * price
- cost of N epochs       = N * cost per epoch                (N defaults to 90)
- time to a target       = epochs to target * hours per epoch
- cost to a target       = time to target * price

With ``--price-per-kwh`` (owned hardware) and a record whose energy was measured:

- energy cost per image  = joules per image / 3.6e6 * price per kWh
- energy cost per epoch  = energy cost per image * IMAGENET_EPOCH_IMAGES

A record with no matching price gets a cost block that says "no price", never a guessed number.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelbench.errors import UsageError
from accelbench.planning import inputs
from accelbench.records import footprint, validation
from accelbench.records.blocks import Cost, CostToTarget, EnergyCost, PriceRef, Training
from accelbench.records.jsonform import from_json

if TYPE_CHECKING:
    from accelbench.records.results import Record

IMAGENET_EPOCH_IMAGES = 1_281_167
DEFAULT_EPOCHS = 90
SECONDS_PER_HOUR = 3600


@dataclass(frozen=True)
class Price:
    name: str
    price_per_hour: float
    currency: str = "USD"
    pricing: str = "on-demand"
    source: str = "given on the command line"
    device_kind: str | None = None
    device_name_pattern: str = ""
    accelerators_per_instance: int | None = None
    #: a catalogue entry's other fields (accelerator, date, notes): for the reader of the file
    details: dict[str, Any] = field(default_factory=dict, compare=False, metadata={"rest": True})

    def matches(self, record: Record) -> bool:
        device = record.device
        return (
            self.device_kind == device.kind
            and self.accelerators_per_instance == device.count
            and bool(re.search(self.device_name_pattern, device.name, re.IGNORECASE))
        )

    def ref(self) -> PriceRef:
        return PriceRef(self.name, self.price_per_hour, self.currency, self.pricing, self.source)


def images_per_dollar(images_per_sec: float, price_per_hour: float) -> float:
    return images_per_sec * SECONDS_PER_HOUR / price_per_hour


def hours_per_epoch(images_per_sec: float, epoch_images: int = IMAGENET_EPOCH_IMAGES) -> float:
    return epoch_images / images_per_sec / SECONDS_PER_HOUR


def cost_of_epochs(epochs: float, images_per_sec: float, price_per_hour: float) -> float:
    return epochs * hours_per_epoch(images_per_sec) * price_per_hour


def time_to_target_hours(epochs_to_target: float, images_per_sec: float) -> float:
    return epochs_to_target * hours_per_epoch(images_per_sec)


def cost_to_target(epochs_to_target: float, images_per_sec: float, price_per_hour: float) -> float:
    return time_to_target_hours(epochs_to_target, images_per_sec) * price_per_hour


def load_catalogue(path: str | Path | None = None) -> list[Price]:
    """The shipped 2018 catalogue, plus (overriding by name) the entries of a user's file."""
    shipped = json.loads(resources.files("accelbench").joinpath("data/prices_2018.json").read_text())
    entries = {e.name: e for e in _checked(shipped, "shipped price catalogue")}
    if path is not None:
        document = inputs.read_json(path, "--prices")  # the flag that gave it, named in every refusal
        entries.update({e.name: e for e in _checked(document, f"--prices {inputs.shown_path(path)}")})
    return list(entries.values())


@dataclass(frozen=True)
class _Catalogue:
    """A price catalogue file (``schemas/prices.schema.json``)."""

    schema_version: str
    entries: list[Price]


def _checked(document: Any, what: str) -> list[Price]:
    validation.validate_or_raise("prices", document, what=what)
    return from_json(_Catalogue, document, what).entries


def choose_price(record: Record, catalogue: list[Price], explicit: Price | None) -> Price | None:
    """The price given for this run (``--price``/``--price-per-hour``), else the catalogue's match."""
    if explicit is not None:
        return explicit
    return next((p for p in catalogue if p.matches(record)), None)


def cost_block(record: Record, price: Price | None, epochs: int = DEFAULT_EPOCHS) -> Cost:
    """The record's ``cost`` block (result schema >= 1.1)."""
    if record.throughput is None:
        return Cost(None, f"no throughput (run {record.status})")
    if price is None:
        d = record.device
        return Cost(None, f"no price for {d.kind} x{d.count} {d.name}".strip())
    ips = record.throughput.images_per_sec
    return Cost(
        price.ref(),
        "",
        images_per_dollar=images_per_dollar(ips, price.price_per_hour),
        cost_per_epoch=cost_of_epochs(1, ips, price.price_per_hour),
        epochs=epochs,
        cost_of_epochs=cost_of_epochs(epochs, ips, price.price_per_hour),
        epoch_images=IMAGENET_EPOCH_IMAGES,
    )


def explicit_price(name: str | None, per_hour: float | None, catalogue: list[Price], currency: str = "USD") -> Price | None:
    """A price the user named (catalogue entry) or gave (per hour), or None."""
    if name and per_hour is not None:
        raise UsageError("give --price or --price-per-hour, not both")
    if name:
        found = next((p for p in catalogue if p.name == name), None)
        if found is None:
            raise UsageError(f"--price {name!r} is not in the catalogue ({', '.join(p.name for p in catalogue)})")
        return found
    if per_hour is not None:
        if per_hour <= 0:
            raise UsageError(f"--price-per-hour must be positive, got {per_hour}")
        return Price(name="command line", price_per_hour=per_hour, currency=currency)
    return None


def implied_images_per_sec(epochs: float, total_cost: float, price_per_hour: float) -> float:
    """The throughput at which ``epochs`` cost ``total_cost`` at ``price_per_hour`` (inverse of cost_of_epochs)."""
    hours = total_cost / price_per_hour
    return epochs * IMAGENET_EPOCH_IMAGES / (hours * SECONDS_PER_HOUR)


def cost_to_target_block(training: Training, price: Price | None) -> CostToTarget | None:
    """Train mode: measured wall time to the target top-1 x price per hour (None: no price or not reached)."""
    if price is None or training.time_to_target_s is None:
        return None
    hours = training.time_to_target_s / SECONDS_PER_HOUR
    return CostToTarget(price.price_per_hour, price.currency, hours, hours * price.price_per_hour)


def energy_cost_block(record: Record, per_kwh: float, currency: str = "USD") -> EnergyCost:
    """``cost.energy``: the measured energy priced per kWh, or no figure and the record's reason."""
    spent = record.energy
    if spent is None or spent.joules_per_image is None:
        reason = spent.reason if spent else None
        return EnergyCost(
            per_kwh, currency, None, None, reason or "the record has no energy figure (written before result schema 1.11)"
        )
    per_image = spent.joules_per_image / footprint.JOULES_PER_KWH * per_kwh
    return EnergyCost(per_kwh, currency, per_image, per_image * IMAGENET_EPOCH_IMAGES)


def price_record(record: Record, price: Price | None, epochs: int = DEFAULT_EPOCHS, per_kwh: float | None = None) -> None:
    """Set the record's ``cost`` block (with its energy priced, given ``per_kwh``) and, for a
    train-mode record, its cost to target."""
    record.cost = cost_block(record, price, epochs)
    if per_kwh is not None:
        record.cost.energy = energy_cost_block(record, per_kwh)
    if record.training:
        record.training.cost_to_target = cost_to_target_block(record.training, price)


@dataclass(frozen=True)
class Pricing:
    """How a command prices its records, from its pricing flags, checked before anything runs."""

    catalogue: list[Price]
    explicit: Price | None = None
    epochs: int = DEFAULT_EPOCHS
    per_kwh: float | None = None

    @classmethod
    def from_flags(
        cls, prices: str | None, price: str | None, price_per_hour: float | None, epochs: int, price_per_kwh: float | None
    ) -> Pricing:
        catalogue = load_catalogue(prices)
        if price_per_kwh is not None and price_per_kwh <= 0:
            raise UsageError(f"--price-per-kwh must be positive, got {price_per_kwh:g}")
        return cls(catalogue, explicit_price(price, price_per_hour, catalogue), epochs, price_per_kwh)

    def price(self, record: Record) -> None:
        price_record(record, choose_price(record, self.catalogue, self.explicit), self.epochs, self.per_kwh)
