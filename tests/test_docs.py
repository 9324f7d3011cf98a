"""The README documents every setting the service reads, with its real default; the code cites only
documents in the repository, and the sections of docs/architecture.md it cites exist."""

import re
import subprocess
from dataclasses import fields
from pathlib import Path

import pytest

from workers.settings import ENV_VARS, Settings

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_lists_every_setting_with_its_default() -> None:
    text = README.read_text(encoding="utf-8")
    defaults = Settings()
    for field in fields(Settings):
        if field.name == "from_environment":
            continue
        row = f"| `{ENV_VARS[field.name]}` | `{getattr(defaults, field.name)}` |"
        assert row in text, f"README lacks the settings row {row!r}"


def test_readme_has_no_unfilled_placeholders() -> None:
    text = README.read_text(encoding="utf-8")
    for placeholder in ("BENCH_SECTION", "SETTINGS_TABLE", "DEPLOY_SECTION"):
        assert placeholder not in text


ARCHITECTURE = README.parent / "docs" / "architecture.md"
# A citation of a section: docs/architecture.md "Dedupe" (a comma between the two is allowed).
_SECTION_CITATION = re.compile(r'docs/architecture\.md,?\s+"([^"]+)"')
# Documents that were never in the repository: the source notes ("seed 000"), design and spec drafts.
_OUTSIDE = re.compile(r"\bseed\s+0\d\d\b|\bseeds/|\b(?:DESIGN|SPEC|DEFECTS|STYLE)\.md\b", re.IGNORECASE)


def _tracked_text_files() -> dict[str, str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=README.parent, capture_output=True, text=True,
                             timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"not a usable git checkout: {exc}")
    files = {}
    for name in filter(None, out.split("\0")):
        path = README.parent / name
        if name == "tests/test_docs.py" or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" not in data[:8192]:
            files[name] = data.decode("utf-8", errors="replace")
    return files


def test_every_cited_architecture_section_exists() -> None:
    headings = {line.lstrip("#").strip() for line in ARCHITECTURE.read_text(encoding="utf-8").splitlines()
                if line.startswith("#")}
    bold = set(re.findall(r"\*\*([^*]+?)\.\*\*", ARCHITECTURE.read_text(encoding="utf-8")))  # "Ordering." etc.
    missing = sorted({f"{name}: {section}" for name, text in _tracked_text_files().items()
                      for section in _SECTION_CITATION.findall(text.replace("\n", " "))
                      if section not in headings and section not in bold})
    assert missing == [], f"citations of sections docs/architecture.md does not have: {missing}"


def test_code_and_docs_cite_only_documents_in_the_repository() -> None:
    offending = {name for name, text in _tracked_text_files().items() if _OUTSIDE.search(text)}
    assert sorted(offending) == [], "cite docs/architecture.md or the paper by title"


def test_architecture_states_the_feature_defaults_the_settings_have() -> None:
    """One source of truth: the Features section quotes workers/settings.py's defaults."""
    d = Settings()
    expected = (f"session top {d.session_top:g},\nweight {d.session_weight:g}; temporal slack "
                f"{d.temporal_slack_days:g} days, weight {d.temporal_weight:g}; first stage weight "
                f"{d.first_stage_weight:g}; BM25 weight {d.bm25_weight:g}; BM25 score weight {d.bm25_score_weight:g}; "
                f"evidence floor {d.evidence_floor:g} (logits).")
    text = (README.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert " ".join(expected.split()) in " ".join(text.split())
