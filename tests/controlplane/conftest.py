"""The Overview's fleet, shared with the browser tests."""

from tests.support.overview import fleet  # noqa: F401  (a fixture)
