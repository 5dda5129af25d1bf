"""A pipeline's graph: its stages, how their typed outputs feed each other, and its latency budget.

``parse_graph`` checks a graph as sent by a client and returns it typed, or raises ``ValidationFailed``
whose message and detail name the stage at fault. It is pure (no database): which models a model stage
may use, and whether the tenant's residency allows each stage, are checked by the service
(``registry.services.pipelines``) on the parsed graph.

Every value that flows along an edge has a type. A stage's inputs name their sources: an earlier stage,
or the request (``request.messages``, the client's messages; ``request.query``, its last user message).
"""

import re
import string
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import re2

from core.errors import ValidationFailed
from core.models import SECRET_NAME

MAX_STAGES = 32
MAX_BUDGET_MS = 600_000
NAME = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
MODEL_REF = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}/[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
VERSION_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")
INDEX = NAME
JURISDICTION = re.compile(r"^[A-Z]{2,8}$")
SECRET_REF = re.compile(f"^{SECRET_NAME}$")

# The types that flow along edges.
TEXT, MESSAGES, VECTOR, DOCUMENTS, LABEL, JSON = "text", "messages", "vector", "documents", "label", "json"
TYPES = (TEXT, MESSAGES, VECTOR, DOCUMENTS, LABEL, JSON)
REQUEST_SOURCES = {"request.messages": MESSAGES, "request.query": TEXT}

# A model stage's task: its inputs (name → type) and its output type.
MODEL_TASKS: dict[str, tuple[dict[str, str], str]] = {
    "chat": ({"messages": MESSAGES}, TEXT),
    "completion": ({"prompt": TEXT}, TEXT),
    "embed": ({"text": TEXT}, VECTOR),
    "rerank": ({"query": TEXT, "documents": DOCUMENTS}, DOCUMENTS),
    "classify": ({"text": TEXT}, LABEL),
}
# Which registry model tasks serve each stage task. An embedding model reranks too: vLLM scores a query
# and a document by the cosine of their embeddings (a bi-encoder); a reranking model scores them together.
SERVED_BY = {
    "chat": ("chat",),
    "completion": ("chat",),
    "embed": ("embedding",),
    "rerank": ("reranking", "embedding"),
    "classify": ("classification",),
}
REDACTIONS = {
    "email": r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}",
    "phone": r"\+?\d[\d ()-]{7,}\d",
    "iban": r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?\b",
    "credit-card": r"\b(?:\d[ -]?){13,19}\b",
    "ipv4": r"\b(?:\d{1,3}\.){3}\d{1,3}\b",
}
COMMON = {"name", "kind", "input", "timeout_ms", "on_failure", "when"}
KIND_FIELDS = {
    "model": {"task", "model", "alias", "version", "labels", "max_tokens", "top_n"},
    "http": {"url", "secret", "jurisdiction", "output", "labels"},
    "retrieve": {"index", "top_k"},
    "redact": {"patterns", "replacement"},
    "template": {"template", "system"},
}
ON_FAILURE = ("fail", "skip")


@dataclass(frozen=True)
class When:
    """Run only when an earlier stage's label is one of ``labels`` (or, ``otherwise``, none of the labels
    its sibling alternatives name)."""

    stage: str
    labels: frozenset[str] = frozenset()
    otherwise: bool = False


@dataclass(frozen=True)
class Stage:
    name: str
    kind: str
    inputs: dict[str, str]  # parameter → source (a stage's name or a request source)
    input_types: dict[str, str]
    output: str  # its output type
    timeout_ms: int | None
    on_failure: str
    when: When | None
    config: dict[str, Any] = field(default_factory=dict)  # the kind's own fields, checked
    labels: frozenset[str] = frozenset()  # what a label-producing stage may answer

    @property
    def passes(self) -> str:
        """A skipping stage's stand-in: the source of its first input of its output's type."""
        return next(s for p, s in self.inputs.items() if self.input_types[p] == self.output)

    @property
    def sources(self) -> set[str]:
        found = {s for s in self.inputs.values() if s not in REQUEST_SOURCES}
        return found | ({self.when.stage} if self.when else set())


@dataclass(frozen=True)
class Graph:
    stages: dict[str, Stage]  # in an order that runs every stage after its sources
    output: tuple[str, ...]  # the answering stage, or exclusive alternatives chosen by a label
    budget_ms: int

    def model_stages(self) -> list[Stage]:
        return [s for s in self.stages.values() if s.kind == "model"]


class Refused(Exception):
    def __init__(self, where: str, message: str):
        super().__init__(message)
        self.where, self.message = where, message


def parse_graph(raw: Any) -> Graph:
    """The graph, checked; ``ValidationFailed`` naming the stage (detail key ``stages.<name>``) if not."""
    try:
        return _parse(raw)
    except Refused as refused:
        raise ValidationFailed(
            f"Pipeline graph: {refused.where}: {refused.message}", detail={refused.where: [refused.message]}
        ) from None


def _parse(raw: Any) -> Graph:
    _check_text({k: v for k, v in raw.items() if k != "stages"} if isinstance(raw, dict) else raw, "graph")
    top = _object(raw, "graph", {"stages", "output", "budget_ms"}, required={"stages", "output", "budget_ms"})
    budget = _integer(top["budget_ms"], "budget_ms", 1, MAX_BUDGET_MS)
    listed = top["stages"]
    if not isinstance(listed, list) or not 1 <= len(listed) <= MAX_STAGES:
        raise Refused("stages", f"must be a list of 1 to {MAX_STAGES} stages")
    stages: dict[str, Stage] = {}
    for position, item in enumerate(listed):
        stage = _stage(item, position, budget)
        if stage.name in stages:
            raise Refused(f"stages.{stage.name}", "two stages have this name")
        stages[stage.name] = stage
    ordered = _ordered(stages)
    for stage in ordered.values():
        _check_edges(stage, ordered)
    output = _output(top["output"], ordered)
    _check_used(ordered, output)
    return Graph(ordered, output, budget)


def _check_text(raw: Any, where: str) -> None:
    """Every string (and key) is text that can be stored, hashed and shown: no lone UTF-16 surrogate
    (JSON can carry one, UTF-8 cannot). NUL characters are refused by each field's own check."""
    stack = [raw]
    while stack:
        item = stack.pop()
        texts = [*item.keys()] if isinstance(item, dict) else []
        texts += [item] if isinstance(item, str) else []
        for text in texts:
            if isinstance(text, str) and not _encodable(text):
                raise Refused(where, "text must be valid Unicode (a lone surrogate is not)")
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _object(raw: Any, where: str, allowed: set[str], required: Iterable[str] = ()) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise Refused(where, "must be an object")
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise Refused(where, f"unknown field(s): {', '.join(map(str, unknown))[:200]}")
    missing = sorted(set(required) - set(raw))
    if missing:
        raise Refused(where, f"missing field(s): {', '.join(missing)}")
    return raw


def _integer(raw: Any, where: str, low: int, high: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not low <= raw <= high:
        raise Refused(where, f"must be a whole number from {low} to {high}")
    return raw


def _text(raw: Any, where: str, pattern: re.Pattern[str], what: str) -> str:
    if not isinstance(raw, str) or not pattern.match(raw):
        raise Refused(where, f"must be {what}")
    return raw


def _stage(raw: Any, position: int, budget: int) -> Stage:
    if not isinstance(raw, dict):
        raise Refused(f"stages[{position}]", "must be an object")
    name = _text(raw.get("name"), f"stages[{position}].name", NAME, "a name of lowercase letters, digits, -")
    where = f"stages.{name}"
    _check_text(raw, where)
    kind = raw.get("kind")
    if not isinstance(kind, str) or kind not in KIND_FIELDS:
        raise Refused(where, f"kind must be one of {', '.join(KIND_FIELDS)}")
    _object(raw, where, COMMON | KIND_FIELDS[kind], required={"name", "kind", "input"})
    inputs = _inputs(raw["input"], where)
    timeout = (
        None
        if raw.get("timeout_ms") is None
        else _integer(raw["timeout_ms"], where + ".timeout_ms", 1, budget)
    )
    on_failure = raw.get("on_failure", "fail")
    if not isinstance(on_failure, str) or on_failure not in ON_FAILURE:
        raise Refused(where + ".on_failure", "must be fail or skip")
    typed = KINDS[kind](raw, where, inputs)
    stage = Stage(
        name=name,
        kind=kind,
        inputs=inputs,
        input_types=typed.inputs,
        output=typed.output,
        timeout_ms=timeout,
        on_failure=on_failure,
        when=_when(raw.get("when"), where),
        config=typed.config,
        labels=typed.labels,
    )
    if on_failure == "skip" and kind == "redact":
        raise Refused(
            where + ".on_failure", "a redaction is never skipped: it would pass the text on unredacted"
        )
    if on_failure == "skip" and stage.output not in stage.input_types.values():
        raise Refused(
            where + ".on_failure",
            f"skip needs an input of its output's type ({stage.output}) to pass on in its place",
        )
    return stage


def _inputs(raw: Any, where: str) -> dict[str, str]:
    if isinstance(raw, str):  # one input: the kind's only parameter
        raw = {"": raw}
    if not isinstance(raw, dict) or not 1 <= len(raw) <= 16:
        raise Refused(where + ".input", "must be a source, or an object of 1 to 16 parameter: source")
    for parameter, source in raw.items():
        if parameter and not NAME.match(parameter.replace("_", "-")):
            raise Refused(f"{where}.input", f"{parameter[:64]!r} is not a name of letters, digits, - or _")
        if not isinstance(source, str) or not (source in REQUEST_SOURCES or NAME.match(source)):
            raise Refused(
                f"{where}.input.{parameter}".rstrip("."),
                "must name an earlier stage, request.messages or request.query",
            )
    return dict(raw)


@dataclass(frozen=True)
class Typed:
    inputs: dict[str, str]
    output: str
    config: dict[str, Any]
    labels: frozenset[str] = frozenset()


def _only(inputs: dict[str, str], where: str, expected: dict[str, str]) -> dict[str, str]:
    """The declared parameters, named as the kind expects (one unnamed input takes the only parameter)."""
    if set(inputs) == {""} and len(expected) == 1:
        inputs[next(iter(expected))] = inputs.pop("")
    if set(inputs) != set(expected):
        raise Refused(where + ".input", f"takes {', '.join(f'{k} ({t})' for k, t in expected.items())}")
    return expected


def _labels(raw: Any, where: str) -> frozenset[str]:
    if not isinstance(raw, list) or not 2 <= len(raw) <= 64:
        raise Refused(where + ".labels", "must list 2 to 64 labels")
    if not all(isinstance(label, str) and NAME.match(label) for label in raw) or len(set(raw)) != len(raw):
        raise Refused(where + ".labels", "labels must be distinct names of lowercase letters, digits, -")
    return frozenset(raw)


def _model(raw: dict[str, Any], where: str, inputs: dict[str, str]) -> Typed:
    task = raw.get("task")
    if not isinstance(task, str) or task not in MODEL_TASKS:
        raise Refused(where + ".task", f"must be one of {', '.join(MODEL_TASKS)}")
    expected, output = MODEL_TASKS[task]
    model = _text(
        raw.get("model"), where + ".model", MODEL_REF, "a model as <owner>/<name> (owner: platform)"
    )
    if "alias" in raw and "version" in raw:
        raise Refused(where, "give an alias or a version, not both")
    config: dict[str, Any] = {"task": task, "model": model}
    if "version" in raw:
        config["version"] = _text(raw["version"], where + ".version", VERSION_REF, "a version")
    else:
        config["alias"] = _text(raw.get("alias", "production"), where + ".alias", NAME, "an alias name")
    if "max_tokens" in raw:
        config["max_tokens"] = _integer(raw["max_tokens"], where + ".max_tokens", 1, 1_000_000)
    if "top_n" in raw:
        if task != "rerank":
            raise Refused(where + ".top_n", "only a rerank stage has top_n")
        config["top_n"] = _integer(raw["top_n"], where + ".top_n", 1, 50)
    labels: frozenset[str] = frozenset()
    if task == "classify":
        labels = _labels(raw.get("labels"), where)
    elif "labels" in raw:
        raise Refused(where + ".labels", "only a classify stage has labels")
    return Typed(_only(inputs, where, expected), output, config, labels)


def _http(raw: dict[str, Any], where: str, inputs: dict[str, str]) -> Typed:
    url = raw.get("url")
    if not isinstance(url, str) or not re.fullmatch(r"https?://[^\s\x00]{1,2000}", url):
        raise Refused(where + ".url", "must be an http(s) URL")
    jurisdiction = _text(
        raw.get("jurisdiction"), where + ".jurisdiction", JURISDICTION, "a jurisdiction (EU, US…)"
    )
    output = raw.get("output")
    if output not in TYPES:
        raise Refused(where + ".output", f"must be one of {', '.join(TYPES)}")
    config = {"url": url, "jurisdiction": jurisdiction}
    if "secret" in raw:  # a reference to a tenant secret, never the secret itself
        config["secret"] = _text(raw["secret"], where + ".secret", SECRET_REF, "the name of a tenant secret")
    labels = _labels(raw.get("labels"), where) if output == LABEL else frozenset()
    if output != LABEL and "labels" in raw:
        raise Refused(where + ".labels", "only an http stage whose output is label has labels")
    if "" in inputs:
        inputs["input"] = inputs.pop("")
    return Typed({name: "" for name in inputs}, output, config, labels)  # inputs of any type


def _retrieve(raw: dict[str, Any], where: str, inputs: dict[str, str]) -> Typed:
    config = {
        "index": _text(raw.get("index"), where + ".index", INDEX, "an index name"),
        "top_k": _integer(raw.get("top_k", 4), where + ".top_k", 1, 50),
    }
    return Typed(_only(inputs, where, {"vector": VECTOR}), DOCUMENTS, config)


def _redact(raw: dict[str, Any], where: str, inputs: dict[str, str]) -> Typed:
    patterns = raw.get("patterns")
    if not isinstance(patterns, list) or not 1 <= len(patterns) <= 32:
        raise Refused(where + ".patterns", "must list 1 to 32 patterns")
    compiled: list[str | dict[str, str]] = []
    for n, pattern in enumerate(patterns):
        if isinstance(pattern, str) and pattern in REDACTIONS:
            compiled.append(pattern)
            continue
        regex = pattern.get("regex") if isinstance(pattern, dict) and set(pattern) == {"regex"} else None
        if not isinstance(regex, str) or not 1 <= len(regex) <= 500:
            raise Refused(
                f"{where}.patterns[{n}]", f'must be one of {", ".join(REDACTIONS)} or {{"regex": "…"}}'
            )
        try:  # RE2: matches in linear time, whatever the pattern and the text (no backtracking blow-up)
            re2.compile(regex)
        except re2.error as exc:
            raise Refused(
                f"{where}.patterns[{n}]", f"is not a regular expression RE2 accepts: {exc}"
            ) from None
        compiled.append({"regex": regex})
    replacement = raw.get("replacement", "[redacted]")
    if not isinstance(replacement, str) or len(replacement) > 64 or "\x00" in replacement:
        raise Refused(where + ".replacement", "must be text of at most 64 characters")
    if set(inputs) == {""}:
        inputs["text"] = inputs.pop("")
    if set(inputs) not in ({"text"}, {"messages"}):
        raise Refused(where + ".input", "takes text (text) or messages (messages)")
    kind = TEXT if "text" in inputs else MESSAGES
    return Typed({next(iter(inputs)): kind}, kind, {"patterns": compiled, "replacement": replacement})


def _template(raw: dict[str, Any], where: str, inputs: dict[str, str]) -> Typed:
    template, system = raw.get("template"), raw.get("system", "")
    for name, value in (("template", template), ("system", system)):
        if not isinstance(value, str) or len(value) > 20_000 or "\x00" in value:
            raise Refused(f"{where}.{name}", "must be text of at most 20,000 characters")
    assert isinstance(template, str)
    try:
        parsed = [(f, spec, conversion) for _, f, spec, conversion in string.Formatter().parse(template)]
    except ValueError as exc:
        raise Refused(where + ".template", f"is not a valid template: {exc}") from None
    fields = {f for f, _, _ in parsed if f is not None}
    if any(spec or conversion for f, spec, conversion in parsed if f is not None):
        raise Refused(where + ".template", "placeholders are plain {names}: no format specs or conversions")
    if "" in inputs:
        raise Refused(where + ".input", "name each input after the {placeholder} it fills")
    if fields != set(inputs):
        raise Refused(
            where + ".template",
            f"its placeholders ({', '.join(sorted(fields)) or 'none'}) must be its inputs",
        )
    typed = {name: "" for name in inputs}  # text, documents, label or json: each is rendered as text
    return Typed(typed, MESSAGES, {"template": template, "system": system})


KINDS = {"model": _model, "http": _http, "retrieve": _retrieve, "redact": _redact, "template": _template}


def _when(raw: Any, where: str) -> When | None:
    if raw is None:
        return None
    cond = _object(raw, where + ".when", {"stage", "labels", "otherwise"}, required={"stage"})
    stage = _text(cond["stage"], where + ".when.stage", NAME, "the name of a stage whose output is a label")
    if cond.get("otherwise") is True and "labels" not in cond:
        return When(stage, otherwise=True)
    if "otherwise" in cond:
        raise Refused(where + ".when", "give labels, or otherwise: true, not both")
    return When(stage, labels=_labels_in(cond.get("labels"), where))


def _labels_in(raw: Any, where: str) -> frozenset[str]:
    if not isinstance(raw, list) or not 1 <= len(raw) <= 64 or not all(isinstance(x, str) for x in raw):
        raise Refused(where + ".when.labels", "must list 1 to 64 labels")
    if not all(NAME.match(label) for label in raw):
        raise Refused(where + ".when.labels", "labels are names of lowercase letters, digits, -")
    return frozenset(raw)


def _ordered(stages: dict[str, Stage]) -> dict[str, Stage]:
    """The stages in an order that runs each after its sources (Kahn's algorithm); a cycle is refused."""
    for stage in stages.values():
        for source in sorted(stage.sources):
            if source not in stages:
                raise Refused(
                    f"stages.{stage.name}", f"its source {source!r} is not a stage of this pipeline"
                )
            if source == stage.name:
                raise Refused(f"stages.{stage.name}", "it takes its own output")
    done: dict[str, Stage] = {}
    waiting = dict(stages)
    while waiting:
        ready = [s for s in waiting.values() if s.sources <= set(done)]
        if not ready:
            raise Refused(
                f"stages.{sorted(waiting)[0]}", f"the stages {', '.join(sorted(waiting))} form a cycle"
            )
        for stage in ready:
            done[stage.name] = waiting.pop(stage.name)
    return done


def _check_edges(stage: Stage, stages: dict[str, Stage]) -> None:
    where = f"stages.{stage.name}"
    for parameter, source in stage.inputs.items():
        given = REQUEST_SOURCES.get(source) or stages[source].output
        wanted = stage.input_types[parameter]
        if wanted and given != wanted:
            raise Refused(f"{where}.input.{parameter}", f"takes {wanted}, but {source} gives {given}")
        if source in stages and stages[source].when not in (None, stage.when):
            raise Refused(
                f"{where}.input.{parameter}",
                f"{source} runs only under its own condition: give {stage.name} the same when",
            )
    if stage.when is not None:
        chooser = stages[stage.when.stage]
        if chooser.output != LABEL:
            raise Refused(where + ".when.stage", f"{chooser.name} gives {chooser.output}, not a label")
        if chooser.when not in (None, stage.when):
            raise Refused(
                where + ".when.stage",
                f"{chooser.name} runs only under its own condition: give {stage.name} the same when",
            )
        unknown = sorted(stage.when.labels - chooser.labels)
        if unknown:
            raise Refused(where + ".when.labels", f"{chooser.name} never answers {', '.join(unknown)}")


def _output(raw: Any, stages: dict[str, Stage]) -> tuple[str, ...]:
    names = [raw] if isinstance(raw, str) else raw
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise Refused("output", "must name the answering stage, or list alternatives chosen by a label")
    for name in names:
        if name not in stages:
            raise Refused("output", f"{name!r} is not a stage of this pipeline")
        if stages[name].output != TEXT:
            raise Refused(
                f"stages.{name}", f"answers the client, so it must give text, not {stages[name].output}"
            )
    if len(names) == 1:
        if stages[names[0]].when is not None:
            raise Refused(f"stages.{names[0]}", "the only answering stage cannot be conditional")
        return (names[0],)
    _check_alternatives([stages[n] for n in names], stages)
    return tuple(names)


def _check_alternatives(alternatives: list[Stage], stages: dict[str, Stage]) -> None:
    """Exactly one alternative runs for every label: one chooser, disjoint labels, every label covered
    (or one alternative taking what the others do not)."""
    whens = [s.when for s in alternatives]
    choosers = {w.stage for w in whens if w is not None}
    if None in whens or len(choosers) != 1:
        raise Refused("output", "alternatives must each have a when on the same label stage")
    chooser = stages[choosers.pop()]
    seen: set[str] = set()
    for when, stage in zip(whens, alternatives, strict=True):
        assert when is not None
        overlap = sorted(seen & when.labels)
        if overlap:
            raise Refused(f"stages.{stage.name}.when.labels", f"{', '.join(overlap)} is chosen twice")
        seen |= when.labels
    otherwise = sum(w.otherwise for w in whens if w is not None)
    if otherwise > 1:
        raise Refused("output", "at most one alternative may be otherwise")
    missing = sorted(chooser.labels - seen)
    if missing and not otherwise:
        raise Refused("output", f"no alternative answers when {chooser.name} says {', '.join(missing)}")


def _check_used(stages: dict[str, Stage], output: tuple[str, ...]) -> None:
    """Every stage feeds the answer: a stage nothing uses would cost time and money for nothing."""
    needed = set(output)
    for stage in reversed(list(stages.values())):
        if stage.name in needed:
            needed |= stage.sources
    unused = [name for name in stages if name not in needed]
    if unused:
        raise Refused(f"stages.{unused[0]}", "nothing uses its output (the answer does not depend on it)")
