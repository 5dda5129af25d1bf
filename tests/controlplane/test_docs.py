"""The docs stand alone and say what the code does: every error code the API can answer with is listed in
docs/api.md, and no document links outside the repository."""

import ast
import re
from pathlib import Path

from core.api.conventions import DRF_CODES

ROOT = Path(__file__).resolve().parents[2]
# The gateway has its own docs.
API_PACKAGES = (
    "controlplane",
    "registry",
    "regions",
    "artifacts",
    "billing",
    "routing",
    "rollouts",
    "autoscaling",
)


def raised_codes() -> dict[str, str]:
    """code -> where: `code="..."` keyword arguments and `code = "..."` class attributes of errors."""
    found: dict[str, str] = {}
    for package in API_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts or "engines" in path.parts:  # engines speak OpenAI's format
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                values: list[ast.expr] = []
                if isinstance(node, ast.Call):
                    values = [kw.value for kw in node.keywords if kw.arg == "code"]
                elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Tuple | ast.Name):
                    target = node.targets[0]
                    names = target.elts if isinstance(target, ast.Tuple) else [target]
                    value = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
                    values = [v for n, v in zip(names, value, strict=False) if getattr(n, "id", "") == "code"]
                for value in values:
                    if isinstance(value, ast.Constant) and isinstance(value.value, str):
                        found.setdefault(value.value, f"{path.relative_to(ROOT)}:{node.lineno}")
    for code in DRF_CODES.values():
        found.setdefault(code, "core/api/conventions.py (DRF_CODES)")
    return found


def test_every_error_code_the_api_answers_with_is_in_docs_api_md() -> None:
    documented = set(re.findall(r"`([a-z_]+)`", (ROOT / "docs" / "api.md").read_text()))
    missing = {code: where for code, where in raised_codes().items() if code not in documented}
    assert not missing, f"error codes missing from docs/api.md: {missing}"


def test_no_document_links_outside_the_repository() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    outside = [
        f"{page.relative_to(ROOT)}: {target}"
        for page in pages
        for target in re.findall(r"\]\(([^)#]+)", page.read_text())
        if "://" not in target and not (page.parent / target).resolve().is_relative_to(ROOT)
    ]
    assert not outside, outside


def test_nothing_in_the_repository_points_at_files_outside_it() -> None:
    """A clone has no shared/ folder beside it: code comments and scripts must not send readers there."""
    outside = re.compile(r"(\.\./)?" + "shared" + r"/[A-Z_]+\.md")
    files = [ROOT / "README.md", ROOT / "Makefile", *(ROOT / "scripts").iterdir(), *(ROOT / ".ci").iterdir()]
    for folder in (*API_PACKAGES, "gateway", "docs", "tests"):
        files += [p for p in (ROOT / folder).rglob("*") if p.suffix in {".py", ".md", ".html", ".sh"}]
    hits = [
        f"{p.relative_to(ROOT)}: {m.group(0)}"
        for p in files
        if p.is_file()
        for m in outside.finditer(p.read_text())
    ]
    assert not hits, hits


def test_audit_docs_name_the_right_migration_and_the_restore_procedure() -> None:
    """Format 1 is what events written before 0008 (hash_version) carry; and a restore from backup, which
    verification reports as "events were removed", has a documented procedure."""
    audit = (ROOT / "core/services/audit.py").read_text()
    line = next(ln for ln in audit.splitlines() if "1: _FORMAT_1" in ln)
    assert "0008" in line and (ROOT / "core/migrations/0008_auditevent_hash_version.py").exists()
    doc = (ROOT / "docs/audit.md").read_text()
    section = doc[doc.index("### Restoring from a backup") :]
    assert "events were removed" in section and "new checkpoint directory" in section
