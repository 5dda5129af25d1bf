"""Artifacts fixtures: replicas live in regions' object stores, so these tests use the local process
regions and the tiny model of tests/regions, re-exported from its conftest."""

from tests.regions.conftest import make_region, tiny_model_dir

__all__ = ["make_region", "tiny_model_dir"]
