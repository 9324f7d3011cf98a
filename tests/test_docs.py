"""The README documents every setting the service reads, with its real default."""

from dataclasses import fields
from pathlib import Path

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
