"""Figures on the autoscaling pages: a measured value or a target for people (4.5, 0.82, 12,345)."""

from typing import Any

from django import template

register = template.Library()


@register.filter
def figure(value: Any) -> str:
    """Four significant digits, no trailing zeros; a dash for no value; anything else as it is."""
    if value is None or value == "":
        return "—"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if abs(value) >= 10_000:  # a queue of thousands reads as 12,345, not 1.234e+04
        return f"{value:,.0f}"
    return f"{value:.4g}"
