from tests.regions.conftest import make_region, tiny_model_dir  # noqa: F401  (shared fixtures)
