"""The API docs group operations by capability: every operation carries exactly one capability tag."""

from drf_spectacular.generators import SchemaGenerator

from core.api.schema import CAPABILITIES

METHODS = {"get", "put", "patch", "post", "delete", "head", "options", "trace"}


def operations() -> list[tuple[str, str, dict]]:  # type: ignore[type-arg]
    schema = SchemaGenerator().get_schema(request=None, public=True)
    return [
        (path, method, operation)
        for path, item in schema["paths"].items()
        for method, operation in item.items()
        if method in METHODS
    ]


def test_every_operation_has_one_capability_tag_and_none_is_the_default() -> None:
    capabilities = {name for name, _, _ in CAPABILITIES}
    untagged = [
        f"{method.upper()} {path}: {operation.get('tags')}"
        for path, method, operation in operations()
        if len(operation.get("tags", [])) != 1 or operation["tags"][0] not in capabilities
    ]
    assert not untagged, "operations without a capability tag:\n" + "\n".join(untagged)


def test_the_schema_declares_each_capability_once_in_order_and_each_is_used() -> None:
    schema = SchemaGenerator().get_schema(request=None, public=True)
    declared = [tag["name"] for tag in schema.get("tags", [])]
    assert declared == [name for name, _, _ in CAPABILITIES]
    used = {operation["tags"][0] for _, _, operation in operations()}
    assert used == set(declared)
