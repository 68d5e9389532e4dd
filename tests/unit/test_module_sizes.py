"""The library's modules stay under 400 lines (STYLE.md): a module that grows past it splits along a seam."""

from __future__ import annotations

from pathlib import Path

LIBRARY = Path(__file__).resolve().parents[2] / "include" / "regen"


def test_no_library_module_is_over_400_lines() -> None:
    sizes = {path.relative_to(LIBRARY).as_posix(): len(path.read_text().splitlines()) for path in LIBRARY.rglob("*.py")}
    assert len(sizes) > 50
    assert {module: lines for module, lines in sizes.items() if lines > 400} == {}
