"""Unit-conversion MCP server: length, mass, volume, time, speed and temperature."""

from __future__ import annotations

from typing import Literal

from registry.decorator import tool
from registry.servers.runtime import ToolInputError, handlers_from_functions, serve

# unit -> (category, factor to the category's base unit: m, kg, l, s, m/s)
FACTORS: dict[str, tuple[str, float]] = {
    "mm": ("length", 1e-3), "cm": ("length", 1e-2), "m": ("length", 1.0), "km": ("length", 1e3),
    "in": ("length", 0.0254), "ft": ("length", 0.3048), "yd": ("length", 0.9144), "mi": ("length", 1609.344),
    "g": ("mass", 1e-3), "kg": ("mass", 1.0), "t": ("mass", 1e3), "oz": ("mass", 0.028349523125),
    "lb": ("mass", 0.45359237),
    "ml": ("volume", 1e-3), "l": ("volume", 1.0), "gal": ("volume", 3.785411784), "cup": ("volume", 0.2365882365),
    "s": ("time", 1.0), "min": ("time", 60.0), "h": ("time", 3600.0), "day": ("time", 86400.0),
    "m/s": ("speed", 1.0), "km/h": ("speed", 1 / 3.6), "mph": ("speed", 0.44704), "kn": ("speed", 1852 / 3600),
}
TEMPERATURES = ("C", "F", "K")
Unit = Literal[
    "mm", "cm", "m", "km", "in", "ft", "yd", "mi", "g", "kg", "t", "oz", "lb", "ml", "l", "gal", "cup",
    "s", "min", "h", "day", "m/s", "km/h", "mph", "kn", "C", "F", "K",
]


def _to_kelvin(value: float, unit: str) -> float:
    return {"C": value + 273.15, "F": (value - 32) * 5 / 9 + 273.15, "K": value}[unit]


def _from_kelvin(value: float, unit: str) -> float:
    return {"C": value - 273.15, "F": (value - 273.15) * 9 / 5 + 32, "K": value}[unit]


@tool
def convert(value: float, from_unit: Unit, to_unit: Unit) -> dict:
    """Convert a value between units of the same kind, rounded to 10 significant digits."""
    if from_unit in TEMPERATURES or to_unit in TEMPERATURES:
        if not (from_unit in TEMPERATURES and to_unit in TEMPERATURES):
            raise ToolInputError(f"cannot convert {from_unit} to {to_unit}: not both temperatures")
        result = _from_kelvin(_to_kelvin(value, from_unit), to_unit)
    else:
        (cat_a, fa), (cat_b, fb) = FACTORS[from_unit], FACTORS[to_unit]
        if cat_a != cat_b:
            raise ToolInputError(f"cannot convert {cat_a} ({from_unit}) to {cat_b} ({to_unit})")
        result = value * fa / fb
    return {"value": float(f"{result:.10g}"), "unit": to_unit}


@tool
def list_units(category: Literal["length", "mass", "volume", "time", "speed", "temperature"] | None = None) -> dict:
    """List the supported units, optionally of one category."""
    table = {u: c for u, (c, _) in FACTORS.items()} | {u: "temperature" for u in TEMPERATURES}
    return {"units": [u for u, c in table.items() if category is None or c == category]}


FUNCTIONS = [convert, list_units]

if __name__ == "__main__":
    serve("units", handlers_from_functions(FUNCTIONS))
