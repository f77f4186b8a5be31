"""Date/time MCP server: calendar arithmetic and time-zone conversion (no wall clock, so results are
deterministic). Dates are ISO 8601 (`2024-03-01`); date-times are ISO 8601 local times (`2024-03-01T09:30`)."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from registry.decorator import tool
from registry.servers.runtime import ToolInputError, handlers_from_functions, serve


def _date(text: str, field: str) -> dt.date:
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise ToolInputError(f"{field}={text!r} is not an ISO date like 2024-03-01") from None


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ToolInputError(f"unknown time zone {name!r}; use an IANA name like Europe/Paris") from None


@tool
def add_days(date: str, days: int) -> dict:
    """The date a number of days after a date (before it, when negative)."""
    return {"date": (_date(date, "date") + dt.timedelta(days=days)).isoformat()}


@tool
def days_between(start: str, end: str) -> dict:
    """Count the days from start date to end date."""
    return {"days": (_date(end, "end") - _date(start, "start")).days}


@tool
def weekday(date: str) -> dict:
    """Name the day of the week of a date."""
    return {"weekday": _date(date, "date").strftime("%A")}


@tool
def convert_timezone(datetime: str, from_zone: str, to_zone: str) -> dict:
    """Convert a local date-time from one time zone to another.

    Args:
        datetime: local time in from_zone, e.g. 2024-03-01T09:30
        from_zone: IANA zone name, e.g. America/New_York
        to_zone: IANA zone name, e.g. Asia/Tokyo
    """
    try:
        local = dt.datetime.fromisoformat(datetime)
    except ValueError:
        raise ToolInputError(f"datetime={datetime!r} is not ISO like 2024-03-01T09:30") from None
    if local.tzinfo is not None:
        raise ToolInputError("give a local time without offset; the zone comes from from_zone")
    moved = local.replace(tzinfo=_zone(from_zone)).astimezone(_zone(to_zone))
    return {"datetime": moved.replace(tzinfo=None).isoformat(timespec="minutes"), "utc_offset": moved.strftime("%z")}


FUNCTIONS = [add_days, days_between, weekday, convert_timezone]

if __name__ == "__main__":
    serve("clock", handlers_from_functions(FUNCTIONS))
