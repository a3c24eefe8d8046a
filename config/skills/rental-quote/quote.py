"""Rental quote: reads {"bike", "unit", "count", "bikes"?, "extras"?} as JSON on stdin and prints
the quote as JSON, from the price list in prices.json beside this script."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, NoReturn

PRICES = json.loads((Path(__file__).parent / "prices.json").read_text(encoding="utf-8"))


def fail(message: str) -> NoReturn:
    sys.exit(message)  # to stderr with exit status 1: the agent reads it and fixes its call


def whole(args: dict[str, Any], key: str, default: int | None, top: int) -> int:
    value = args.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
        fail(f"{key} must be a whole number from 1 to {top}, not {value!r}")
    return value


def find_bike(name: Any) -> tuple[str, dict[str, Any]]:
    wanted = str(name).strip().lower()
    for key, bike in PRICES["bikes"].items():
        if wanted == key or wanted in bike["aliases"]:
            return key, bike
    fail(f"unknown bike {name!r}; choose one of: {', '.join(PRICES['bikes'])}")


def money(amount: float) -> float:
    return int(amount) if float(amount).is_integer() else round(amount, 2)


def quote(args: dict[str, Any]) -> dict[str, Any]:
    key, bike = find_bike(args.get("bike", ""))
    unit = args.get("unit")
    if unit not in PRICES["units"]:
        fail(f"unit must be one of: {', '.join(PRICES['units'])}; not {unit!r}")
    count = whole(args, "count", None, PRICES["max_count"])
    bikes = whole(args, "bikes", 1, PRICES["max_bikes"])
    extras = args.get("extras") or {}
    if not isinstance(extras, dict):
        fail('extras must be an object like {"child_seat": 1}')
    duration = f"{count} {unit if count == 1 else PRICES['units'][unit]['plural']}"
    rate = bike["prices"][unit]
    lines = [(f"{bike['label']} x {bikes}, {duration} at {rate} per {unit}", rate * count * bikes)]
    days = max(PRICES["min_extra_days"], count * PRICES["units"][unit]["extra_days"])
    for name in extras:
        extra = PRICES["extras"].get(name)
        if extra is None:
            fail(f"unknown extra {name!r}; choose from: {', '.join(PRICES['extras'])}")
        if extras[name] == 0:
            continue
        n = whole(extras, name, None, PRICES["max_bikes"])
        per_day = extra["per_day"]
        lines.append(
            (f"{extra['label']} x {n}, {days} day(s) at {per_day} per day", per_day * days * n)
        )
    return {
        "currency": PRICES["currency"],
        "bike": key,
        "bikes": bikes,
        "duration": duration,
        "lines": [{"item": item, "amount": money(amount)} for item, amount in lines],
        "total": money(sum(amount for _, amount in lines)),
        "deposit": money(bike["deposit"] * bikes),
        "deposit_note": "a refundable hold on a card, released when the bikes come back undamaged",
        "included": PRICES["included"],
    }


if __name__ == "__main__":
    try:
        request = json.load(sys.stdin)
    except ValueError:
        fail("the arguments must be a JSON object")
    if not isinstance(request, dict):
        fail("the arguments must be a JSON object")
    print(json.dumps(quote(request), ensure_ascii=False))
