"""The README stays a ten-minute read whose quick start is what CI runs, and every page it sends a reader to exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)#:]+)(?:#[^)]*)?\)")


def test_the_readme_quick_start_is_what_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split("## Quick start", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].strip() for line in block.splitlines()]
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.startswith("make ")]
    assert commands == ci == ["make demo", "make test"]


def test_the_readme_is_short() -> None:
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 300


def test_every_relative_link_of_the_readme_and_the_docs_resolves() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = [
        f"{page.relative_to(ROOT)}: {target}"
        for page in pages
        for target in LINK.findall(page.read_text(encoding="utf-8"))
        if not (page.parent / target).exists()
    ]
    assert broken == []
    linked = set(LINK.findall((ROOT / "README.md").read_text(encoding="utf-8")))
    assert {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")} - linked <= {"docs/qwen3.6-profile-notes.md"}


def test_the_docs_tell_no_session_history() -> None:
    """Figures are stated with the command that reproduces them, not as a story of when they were taken."""
    story = re.compile(r"this (afternoon|morning)|\bissue \d+|\bcommit [0-9a-f]{7}|\b[0-9a-f]{7}'s code", re.I)
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    told = [f"{p.name}: {m.group(0)}" for p in pages for m in story.finditer(p.read_text(encoding="utf-8"))]
    assert told == []
