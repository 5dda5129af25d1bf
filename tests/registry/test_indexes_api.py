"""Retrieval indexes through the API: a tenant fills its own with documents and their vectors; bad
vectors are refused whole; another tenant sees and touches nothing; gateways fetch them with their token."""

import pytest

from core.models import AuditEvent
from registry.models import IndexDocument, RetrievalIndex
from tests.support.gateway import gateway_secret
from tests.support.principals import mint

A = "/api/v1/indexes/acme/handbook/"
DOCS = [
    {"key": "refunds", "text": "Refunds take 30 days.", "vector": [1, 0, 0]},
    {"key": "shipping", "text": "Shipping takes 2 days.", "vector": [0, 1, 0.5]},
]


@pytest.fixture
def handbook(world, api):
    created = api(world.alice).post(
        "/api/v1/indexes/", {"owner": "acme", "name": "handbook", "dimensions": 3}, format="json"
    )
    assert created.status_code == 201, created.json()
    return created.json()


def test_a_tenant_fills_lists_and_prunes_its_index(world, api, handbook):
    alice = api(world.alice)
    put = alice.put(A + "documents/", {"documents": DOCS}, format="json")
    assert put.json() == {"revision": 1, "documents": 2}
    again = alice.put(
        A + "documents/", {"documents": [{**DOCS[0], "text": "Refunds take 14 days."}]}, format="json"
    )
    assert again.json() == {"revision": 2, "documents": 2}  # replaced by key
    listed = alice.get(A + "documents/").json()
    assert listed["documents"] == [
        {"key": "refunds", "text": "Refunds take 14 days."},
        {"key": "shipping", "text": "Shipping takes 2 days."},
    ]
    assert alice.delete(A + "documents/shipping/").status_code == 204
    assert alice.delete(A + "documents/shipping/").status_code == 404
    assert alice.get(A).json()["revision"] == 3 and alice.get(A).json()["documents"] == 1
    actions = set(AuditEvent.objects.filter(action__startswith="index.").values_list("action", flat=True))
    assert actions == {"index.created", "index.documents_put", "index.document_deleted"}


@pytest.mark.parametrize(
    "documents",
    [
        [{**DOCS[0], "vector": [1, 0]}],
        [{**DOCS[0], "vector": ["1", 0, 0]}],
        [{**DOCS[0], "vector": [True, 0, 0]}],
        [{**DOCS[0], "vector": [[1], 0, 0]}],
        [DOCS[0], DOCS[0]],
        [{**DOCS[0], "extra": 1}],
        [{"key": "x", "text": "y"}],
        [{**DOCS[0], "key": f"k{n}"} for n in range(500)],  # 501 with the fine one
    ],
)
def test_bad_documents_are_refused_whole(world, api, handbook, documents):
    alice = api(world.alice)
    alice.put(A + "documents/", {"documents": [DOCS[1]]}, format="json")
    refused = alice.put(
        A + "documents/", {"documents": [*documents, {**DOCS[1], "key": "fine"}]}, format="json"
    )
    assert refused.status_code == 400 and "error" in refused.json()
    assert list(IndexDocument.objects.values_list("key", flat=True)) == ["shipping"]
    assert RetrievalIndex.objects.get().revision == 1


def test_non_finite_numbers_and_empty_batches_are_refused(world, api, handbook):
    alice = api(world.alice)
    for raw in (
        b'{"documents": [{"key": "x", "text": "t", "vector": [1e999, 0, 0]}]}',
        b'{"documents": [{"key": "x", "text": "t", "vector": [NaN, 0, 0]}]}',
        b'{"documents": []}',
        b'{"documents": [{"key": "x", "text": "t", "vector": [1' + b"0" * 400 + b", 0, 0]}]}",
    ):
        refused = alice.put(A + "documents/", raw, content_type="application/json")
        assert refused.status_code == 400 and "error" in refused.json(), raw
    assert IndexDocument.objects.count() == 0


def test_another_tenant_and_a_viewer_cannot_touch_it_and_gateways_read_it(world, api, handbook):
    api(world.alice).put(A + "documents/", {"documents": DOCS}, format="json")
    bob = api(world.bob)
    assert "handbook" not in str(bob.get("/api/v1/indexes/").json())
    for call in (
        bob.get(A),
        bob.get(A + "documents/"),
        bob.put(A + "documents/", {"documents": DOCS}, format="json"),
        bob.delete(A + "documents/refunds/"),
    ):
        assert call.status_code == 404
    assert bob.post(
        "/api/v1/indexes/", {"owner": "acme", "name": "mine", "dimensions": 3}, format="json"
    ).status_code in (403, 404)
    assert api(world.vera).put(A + "documents/", {"documents": DOCS}, format="json").status_code == 403
    assert api(world.alice).get("/api/v1/routing/indexes/acme/handbook/").status_code == 403  # gateways only
    assert (
        api(secret=mint(world.admin, ["gateway:sync"]))
        .get(A.replace("/api/v1/indexes/", "/api/v1/routing/indexes/"))
        .status_code
        == 403
    )  # a person, even an admin
    gateway = api(secret=gateway_secret(world))
    fetched = gateway.get("/api/v1/routing/indexes/acme/handbook/").json()
    assert fetched["revision"] == 1 and fetched["documents"][0] == {**DOCS[0], "vector": [1, 0, 0]}
    assert IndexDocument.objects.count() == 2


def test_names_are_those_a_stage_can_name_and_the_size_is_bounded(world, api, handbook):
    alice = api(world.alice)
    for name in ("My_Docs", "docs!", "-docs"):
        body = {"owner": "acme", "name": name, "dimensions": 3}
        assert alice.post("/api/v1/indexes/", body, format="json").status_code == 400, name
    wide = alice.post(
        "/api/v1/indexes/", {"owner": "acme", "name": "wide", "dimensions": 4096}, format="json"
    )
    assert wide.status_code == 201
    vector = [0.5] * 4096
    for start in range(0, 900, 100):  # 900 documents, within the bound
        fill = [{"key": f"k{n}", "text": "t", "vector": vector} for n in range(start, start + 100)]
        answer = alice.put("/api/v1/indexes/acme/wide/documents/", {"documents": fill}, format="json")
        assert answer.status_code == 200
    more = [{"key": f"k{n}", "text": "t", "vector": vector} for n in range(900, 1000)]
    over = alice.put("/api/v1/indexes/acme/wide/documents/", {"documents": more}, format="json")
    assert over.status_code == 400 and "holds at most 976 documents" in over.json()["error"]["message"]
