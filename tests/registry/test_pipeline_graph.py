"""A pipeline's graph is checked as a whole before anything is written: structure, typed edges, the DAG,
conditional routes; every refusal names the stage at fault."""

import copy
from typing import Any

import pytest

from core.errors import ValidationFailed
from registry.pipelines import parse_graph


def rag() -> dict[str, Any]:
    """Redact the question, embed it, retrieve, rerank (optional), fill a prompt, answer."""
    return {
        "stages": [
            {
                "name": "clean",
                "kind": "redact",
                "input": "request.query",
                "patterns": ["email", {"regex": "\\d{6}"}],
            },
            {"name": "embed", "kind": "model", "task": "embed", "model": "acme/minilm", "input": "clean"},
            {"name": "search", "kind": "retrieve", "index": "handbook", "top_k": 3, "input": "embed"},
            {
                "name": "rerank",
                "kind": "model",
                "task": "rerank",
                "model": "platform/bge-reranker",
                "input": {"query": "clean", "documents": "search"},
                "timeout_ms": 300,
                "on_failure": "skip",
            },
            {
                "name": "prompt",
                "kind": "template",
                "template": "Answer from:\n{docs}\n\nQuestion: {question}",
                "input": {"docs": "rerank", "question": "clean"},
            },
            {
                "name": "answer",
                "kind": "model",
                "task": "chat",
                "model": "acme/llama-3-8b",
                "input": "prompt",
            },
        ],
        "output": "answer",
        "budget_ms": 8000,
    }


def routed() -> dict[str, Any]:
    """A classifier's label chooses the generator."""
    return {
        "stages": [
            {
                "name": "topic",
                "kind": "model",
                "task": "classify",
                "model": "acme/router",
                "labels": ["billing", "tech", "other"],
                "input": "request.query",
            },
            {
                "name": "billing",
                "kind": "model",
                "task": "chat",
                "model": "acme/billing-bot",
                "input": "request.messages",
                "when": {"stage": "topic", "labels": ["billing"]},
            },
            {
                "name": "general",
                "kind": "model",
                "task": "chat",
                "model": "acme/llama-3-8b",
                "input": "request.messages",
                "when": {"stage": "topic", "otherwise": True},
            },
        ],
        "output": ["billing", "general"],
        "budget_ms": 5000,
    }


def test_a_rag_graph_is_ordered_and_typed():
    graph = parse_graph(rag())
    assert list(graph.stages) == ["clean", "embed", "search", "rerank", "prompt", "answer"]
    assert graph.stages["rerank"].input_types == {"query": "text", "documents": "documents"}
    assert graph.stages["answer"].inputs == {"messages": "prompt"}  # the only parameter, named
    assert graph.output == ("answer",)
    assert [s.name for s in graph.model_stages()] == ["embed", "rerank", "answer"]


def test_stages_may_be_listed_in_any_order_and_fan_out():
    raw = rag()
    raw["stages"].reverse()
    assert next(iter(parse_graph(raw).stages)) == "clean"
    parallel = rag()  # a second retriever beside the first, both merged by the template
    parallel["stages"].insert(3, {"name": "faq", "kind": "retrieve", "index": "faq", "input": "embed"})
    parallel["stages"][5]["template"] += "\nFAQ: {faq}"
    parallel["stages"][5]["input"]["faq"] = "faq"
    assert set(parse_graph(parallel).stages["prompt"].sources) == {"rerank", "clean", "faq"}


def test_a_label_chooses_among_alternatives():
    graph = parse_graph(routed())
    assert graph.output == ("billing", "general")
    assert graph.stages["general"].when.otherwise  # type: ignore[union-attr]


def _set(raw: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """Set (or, value ``...``, delete) the field at ``stages.<name>.<field>`` or a top-level field."""
    raw = copy.deepcopy(raw)
    parts = path.split(".")
    if parts[0] == "stages" and len(parts) > 1:
        target = next(s for s in raw["stages"] if s["name"] == parts[1])
        parts = parts[2:]
    else:
        target = raw
    for part in parts[:-1]:
        target = target[part]
    if value is ...:
        del target[parts[-1]]
    else:
        target[parts[-1]] = value
    return raw


BAD = [
    # (graph, the detail key the refusal names, words of its message)
    ("not a graph", "graph", "must be an object"),
    (_set(rag(), "extra", 1), "graph", "unknown field(s): extra"),
    (_set(rag(), "budget_ms", "8000"), "budget_ms", "whole number"),
    (_set(rag(), "budget_ms", True), "budget_ms", "whole number"),
    (_set(rag(), "stages", []), "stages", "1 to 32"),
    ({**rag(), "stages": [rag()["stages"][0]] * 33}, "stages", "1 to 32"),
    (_set(rag(), "stages.embed.kind", "shell"), "stages.embed", "kind must be one of"),
    (_set(rag(), "stages.embed.task", "dance"), "stages.embed.task", "must be one of"),
    (_set(rag(), "stages.embed.model", "minilm"), "stages.embed.model", "<owner>/<name>"),
    (_set(rag(), "stages.embed.model", "acme/mini\x00lm"), "stages.embed.model", "<owner>/<name>"),
    (_set(rag(), "stages.embed.image", "x"), "stages.embed", "unknown field(s): image"),
    (_set(rag(), "stages.embed.top_n", 2), "stages.embed.top_n", "only a rerank stage has top_n"),
    (_set(rag(), "stages.rerank.top_n", 0), "stages.rerank.top_n", "whole number from 1 to 50"),
    (_set(rag(), "stages.rerank.top_n", "2"), "stages.rerank.top_n", "whole number from 1 to 50"),
    (_set(rag(), "stages.embed.input", ...), "stages.embed", "missing field(s): input"),
    (_set(rag(), "stages.embed.input", "nowhere"), "stages.embed", "'nowhere' is not a stage"),
    (_set(rag(), "stages.embed.input", "request.messages"), "stages.embed.input.text", "takes text"),
    (
        _set(rag(), "stages.search.input", "clean"),
        "stages.search.input.vector",
        "takes vector, but clean gives text",
    ),
    (_set(rag(), "stages.search.top_k", 500), "stages.search.top_k", "from 1 to 50"),
    (_set(rag(), "stages.rerank.timeout_ms", 9000), "stages.rerank.timeout_ms", "from 1 to 8000"),
    (_set(rag(), "stages.embed.on_failure", "skip"), "stages.embed.on_failure", "skip needs an input"),
    (_set(rag(), "stages.prompt.template", "Answer {docs}"), "stages.prompt.template", "must be its inputs"),
    (_set(rag(), "stages.prompt.template", "Answer {docs"), "stages.prompt.template", "not a valid template"),
    (_set(rag(), "stages.clean.patterns", ["passport"]), "stages.clean.patterns[0]", "must be one of"),
    (
        _set(rag(), "stages.clean.patterns", [{"regex": "("}]),
        "stages.clean.patterns[0]",
        "not a regular expression",
    ),
    (_set(rag(), "stages.answer.input", "search"), "stages.answer.input.messages", "takes messages"),
    (_set(rag(), "stages.clean.input", "answer"), "stages.answer", "form a cycle"),
    (_set(rag(), "stages.embed.input", "embed"), "stages.embed", "its own output"),
    (_set(rag(), "output", "embed"), "stages.embed", "must give text, not vector"),
    (_set(rag(), "output", "nobody"), "output", "'nobody' is not a stage"),
    (
        {
            **rag(),
            "stages": [
                *rag()["stages"],
                {"name": "idle", "kind": "retrieve", "index": "x", "input": "embed"},
            ],
        },
        "stages.idle",
        "nothing uses its output",
    ),
    (
        {**rag(), "stages": [*rag()["stages"], rag()["stages"][0]]},
        "stages.clean",
        "two stages have this name",
    ),
    (_set(routed(), "stages.general.when", ...), "output", "each have a when on the same label stage"),
    (_set(routed(), "stages.general.when", {"stage": "topic", "labels": ["tech"]}), "output", "says other"),
    (
        _set(routed(), "stages.general.when", {"stage": "topic", "labels": ["billing", "tech", "other"]}),
        "stages.general.when.labels",
        "billing is chosen twice",
    ),
    (
        _set(routed(), "stages.billing.when.labels", ["refunds"]),
        "stages.billing.when.labels",
        "never answers refunds",
    ),
    (
        _set(routed(), "stages.billing.when.stage", "general"),
        "stages.billing.when.stage",
        "gives text, not a label",
    ),
    (_set(routed(), "output", "billing"), "stages.billing", "cannot be conditional"),
    (_set(routed(), "stages.topic.labels", ["only"]), "stages.topic.labels", "2 to 64 labels"),
    (
        _set(rag(), "stages.answer.when", {"stage": "clean", "labels": ["x"]}),
        "stages.answer.when.stage",
        "clean gives text, not a label",
    ),
    (
        _set(routed(), "stages.general.input", "billing"),
        "stages.general.input.messages",
        "takes messages, but billing gives text",
    ),
    (
        {
            **routed(),
            "stages": [
                *routed()["stages"][:2],
                {**routed()["stages"][2], "input": "polish"},
                {"name": "polish", "kind": "redact", "patterns": ["email"], "input": "billing"},
            ],
        },
        "stages.polish.input.text",
        "billing runs only under its own condition",
    ),
]


@pytest.mark.parametrize(("raw", "where", "words"), BAD, ids=[f"{n}-{b[1]}" for n, b in enumerate(BAD)])
def test_a_bad_graph_is_refused_naming_the_stage(raw, where, words):
    with pytest.raises(ValidationFailed) as refused:
        parse_graph(raw)
    assert list(refused.value.detail) == [where], refused.value.message
    assert words in refused.value.message


def test_an_http_stage_declares_its_jurisdiction_and_output():
    raw = rag()
    raw["stages"][2] = {
        "name": "search",
        "kind": "http",
        "url": "https://retriever.acme.example/search",
        "secret": "retriever-token",
        "jurisdiction": "EU",
        "output": "documents",
        "input": {"vector": "embed", "query": "clean"},
    }
    stage = parse_graph(raw).stages["search"]
    assert (stage.output, stage.config["jurisdiction"], stage.config["secret"]) == (
        "documents",
        "EU",
        "retriever-token",
    )
    for field, value, words in [
        ("jurisdiction", "eu", "a jurisdiction"),
        ("url", "ftp://x", "http(s) URL"),
        ("output", "blob", "must be one of"),
        ("secret", "Bearer abc", "the name of a tenant secret"),
    ]:
        with pytest.raises(ValidationFailed) as refused:
            parse_graph(_set(raw, f"stages.search.{field}", value))
        assert list(refused.value.detail) == [f"stages.search.{field}"] and words in refused.value.message


HOSTILE = [
    ({**rag(), "output\ud800": 1}, "graph", "valid Unicode"),
    (
        _set(rag(), "stages.prompt.template", "Answer {docs} {question} \ud800"),
        "stages.prompt",
        "valid Unicode",
    ),
    (_set(rag(), "stages.clean.patterns", [{"regex": "\ud800"}]), "stages.clean", "valid Unicode"),
    (_set(rag(), "stages.answer.max_tokens\udc80", 1), "stages.answer", "valid Unicode"),
    (_set(routed(), "stages.billing.when.labels", ["\udc80"]), "stages.billing", "valid Unicode"),
    (
        _set(routed(), "stages.billing.when.labels", ["x" * 1_200_000]),
        "stages.billing.when.labels",
        "names of",
    ),
    (
        _set(routed(), "stages.billing.when.labels", [f"l{n}" for n in range(200_000)]),
        "stages.billing.when.labels",
        "1 to 64",
    ),
    (_set(rag(), "stages.embed.kind", ["model"]), "stages.embed", "kind must be one of"),
    (_set(rag(), "stages.embed.task", {"embed": 1}), "stages.embed.task", "must be one of"),
    (_set(rag(), "stages.rerank.on_failure", ["skip"]), "stages.rerank.on_failure", "must be fail or skip"),
    (
        _set(rag(), "stages.prompt.template", "Answer {docs:>2000000000}\n{question}"),
        "stages.prompt.template",
        "no format specs",
    ),
    (
        _set(rag(), "stages.prompt.template", "{docs!r} {question}"),
        "stages.prompt.template",
        "no format specs",
    ),
    (
        {
            **rag(),
            "stages": [
                *rag()["stages"][:4],
                {**rag()["stages"][4], "template": "{0}", "input": {"0": "rerank"}},
                rag()["stages"][5],
            ],
        },
        "stages.prompt.input",
        "'0' is not a name",
    ),
    (_set(rag(), "stages.clean.patterns", [{"regex": "(a)\\1"}]), "stages.clean.patterns[0]", "RE2 accepts"),
    (_set(rag(), "stages.clean.on_failure", "skip"), "stages.clean.on_failure", "never skipped"),
]


@pytest.mark.parametrize(
    ("raw", "where", "words"), HOSTILE, ids=[f"{n}-{h[1]}" for n, h in enumerate(HOSTILE)]
)
def test_hostile_graphs_are_refused_not_crashed_on(raw, where, words):
    with pytest.raises(ValidationFailed) as refused:
        parse_graph(raw)
    assert list(refused.value.detail) == [where], refused.value.message
    assert words in refused.value.message


def test_a_condition_on_a_conditional_chooser_must_be_the_choosers_own():
    raw = routed()
    raw["stages"][0]["when"] = {"stage": "pre", "labels": ["go"]}
    raw["stages"].insert(
        0,
        {
            "name": "pre",
            "kind": "model",
            "task": "classify",
            "model": "acme/router",
            "labels": ["go", "stop"],
            "input": "request.query",
        },
    )
    with pytest.raises(ValidationFailed) as refused:
        parse_graph(raw)
    assert "topic runs only under its own condition" in refused.value.message
