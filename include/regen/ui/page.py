"""The "Drafter data" page as HTML: the catalog's numbers in tables, plots as inline SVG, no script library.

Rendered by Jinja2 templates (regen/ui/templates/) with autoescape on: every value read from storage is escaped
wherever a template places it, so no hand escaping can be forgotten. Numbers go through filters that format only
real numbers; anything else where a number belongs (another schema, or a value someone wrote into the bucket) is
shown as text, escaped. Pure functions of the catalog's dictionaries (regen.ui.catalog), so the page is tested
without a browser or Airflow. Links into Airflow's UI target the top window: the page is shown inside Airflow's UI,
in a frame; every link is relative, so the page works under a base_url with a path prefix.
"""

from __future__ import annotations

import itertools
from functools import cache
from importlib import resources
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
from markupsafe import Markup

from regen.ui.catalog import Overview

DAG_ID = "eagle3_regen"
# Airflow's own pages and API, relative to the page's URL (Airflow's base URL + /drafter/): under a base_url with a
# path prefix they are found as well.
AIRFLOW = "../"
BAR = "#4c78a8"
BAR_AFTER = "#f58518"
WIDTH, HEIGHT = 360, 120


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def n(value: Any, spec: str = "") -> Any:
    """A number in the format `spec`; None is "-"; anything else is returned as it is, for autoescape to escape."""
    if value is None:
        return "-"
    return format(value, spec) if _number(value) else value


def pct(value: Any) -> Any:
    return n(100 * value, ".1f") + "%" if _number(value) else n(value)


def num(value: Any) -> Any:
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1 else f"{value:,.1f}"
    return n(value, ",")


def eta(seconds: Any) -> Any:
    if not _number(seconds):
        return n(seconds)
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def idle(seconds: Any) -> Any:
    """How long ago, roughly: 40s, 12m, 5h, 3d."""
    if not _number(seconds):
        return n(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def when(value: Any) -> str:
    """An ISO time as `2026-12-01 02:08:36`."""
    return str(value or "")[:19].replace("T", " ")


def segment(value: Any) -> str:
    """One path segment of a URL: every character that could end it or start another part quoted."""
    return quote(str(value), safe="")


def query(**params: Any) -> str:
    """The page's own query string, from the parameters that are set."""
    return urlencode({k: v for k, v in params.items() if v is not None})


def mapping(value: Any) -> dict[str, Any]:
    """A JSON object as read, or an empty one where a file holds something else."""
    return value if isinstance(value, dict) else {}


def short(value: Any, length: int) -> str:
    return "" if value is None else str(value)[:length]


def cost_line(cost: Any) -> str:
    """Prefix-cache share and GPU-hours under the token totals; the cost per 1M training tokens with a price."""
    cost = mapping(cost)
    parts = []
    if cost.get("cached_share") is not None:
        parts.append(f"{pct(cost['cached_share'])} cached")
    if cost.get("gpu_hours") is not None:
        parts.append(f"{n(cost['gpu_hours'], '.3g')} GPU-h")
    if cost.get("cost_per_million_train_tokens") is not None:
        parts.append(f"{n(cost['cost_per_million_train_tokens'], '.4g')} {n(cost.get('currency'))}/1M tokens")
    return ", ".join(parts)  # plain text: autoescape escapes all of it


def trigger_conf(dataset: str, version: str | None = None) -> dict[str, Any]:
    """The run a Regenerate (a dataset) or Resume (a version) button proposes."""
    return {"datasets": [dataset]} if version is None else {"datasets": [dataset], "version": version}


def previous_on_page(versions: list[dict[str, Any]]) -> dict[str, str]:
    """Each published version's previous published one among those shown: its "compare with previous" link."""
    shown = [v["version"] for v in versions if v["state"] == "published"]
    return dict(itertools.pairwise(shown))


def row_plots(row: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A version's output and prompt length histograms and its verdicts."""
    label, found = row["version"], mapping(row.get("histograms"))
    hists = [histogram([(label, found.get(name))], f"{name} length") for name in ("output", "prompt")]
    if coverage := draft_coverage(mapping(row.get("vocab"))):
        hists.append(coverage)
    return hists, verdicts([(v, [c]) for v, c in mapping(row.get("verdicts")).items()], [label])


def comparison_plots(comparison: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Both versions' histograms overlaid, and both verdict mixes."""
    a, b = comparison["before"], comparison["after"]
    hists = [
        histogram(
            [(a["version"], mapping(a["histograms"]).get(name)), (b["version"], mapping(b["histograms"]).get(name))],
            f"{name} length",
        )
        for name in ("output", "prompt")
    ]
    rows = [(v["verdict"], [v["before"], v["after"]]) for v in comparison["verdicts"]]
    return hists, verdicts(rows, [a["version"], b["version"]])


def histogram(histograms: list[tuple[str, Any]], title: str) -> dict[str, Any]:
    """Bars of one or two histograms (before, after) on one token axis: each version's bins keep their own edges,
    placed by token count, so versions with different longest answers still line up."""
    shown = [(label, h) for label, h in histograms if _histogram(h)]
    plot: dict[str, Any] = {"title": title, "width": WIDTH, "height": HEIGHT, "bars": [], "legend": []}
    plot["unit"] = "tokens"
    if not shown:
        return plot
    top = max(h["edges"][-1] for _, h in shown) or 1.0
    peak = max(max(h["counts"]) for _, h in shown) or 1
    scale = (WIDTH - 40) / top
    for series, (label, h) in enumerate(shown):
        colour = BAR if series == 0 else BAR_AFTER
        edges = h["edges"]
        for i, count in enumerate(h["counts"]):
            width = (edges[i + 1] - edges[i]) * scale / len(shown)
            height = (HEIGHT - 30) * count / peak
            x = 30 + edges[i] * scale + series * width
            plot["bars"].append(
                {
                    "x": f"{x:.1f}",
                    "y": f"{HEIGHT - 20 - height:.1f}",
                    "width": f"{max(width - 1, 1):.1f}",
                    "height": f"{height:.1f}",
                    "colour": colour,
                    "title": f"{label} {edges[i]:.0f}-{edges[i + 1]:.0f}: {count}",
                }
            )
    if len(shown) > 1:  # one: its row names it
        plot["legend"] = [(label, BAR if i == 0 else BAR_AFTER) for i, (label, _) in enumerate(shown)]
    plot["top"] = f"{top:.0f}"
    return plot


def draft_coverage(vocab: dict[str, Any]) -> dict[str, Any] | None:
    """The share of the train answers' tokens the most frequent ids cover, a bar per draft vocabulary size (the
    version's own in the bar's colour for a second version); None for a version published before vocab/."""
    curve = mapping(vocab.get("coverage_curve"))
    points = sorted((int(size), float(share)) for size, share in curve.items() if str(size).isdigit())
    if not points:
        return None
    draft, width = vocab.get("draft_vocab_size"), (WIDTH - 40) / len(points)
    title = f"draft vocabulary: {draft} ids cover {100 * float(vocab.get('coverage') or 0):.1f}% of answer tokens"
    bars = [
        {
            "x": f"{30 + i * width:.1f}",
            "y": f"{HEIGHT - 20 - (HEIGHT - 30) * share:.1f}",
            "width": f"{max(width - 2, 1):.1f}",
            "height": f"{(HEIGHT - 30) * share:.1f}",
            "colour": BAR_AFTER if size == draft else BAR,
            "title": f"{size} ids: {100 * share:.2f}%",
        }
        for i, (size, share) in enumerate(points)
    ]
    return {
        "title": title,
        "width": WIDTH,
        "height": HEIGHT,
        "bars": bars,
        "legend": [],
        "unit": "ids",
        "top": str(points[-1][0]),
    }


def _histogram(value: Any) -> bool:
    """A histogram whose counts and edges are lists of numbers, one edge more than counts."""
    if not isinstance(value, dict):
        return False
    counts, edges = value.get("counts"), value.get("edges")
    if not (isinstance(counts, list) and isinstance(edges, list) and counts and len(edges) == len(counts) + 1):
        return False
    return all(_number(v) for v in counts + edges)


def verdicts(rows: list[tuple[Any, list[Any]]], labels: list[str]) -> dict[str, Any]:
    """Horizontal bars, one group per verdict (one bar per version compared)."""
    rows = [(verdict, [c if _number(c) else 0 for c in counts]) for verdict, counts in rows]
    peak = max((max(counts) for _, counts in rows), default=0) or 1
    line, gap = 12, 6
    bars, y = [], 16
    for verdict, counts in rows:
        for series, count in enumerate(counts):
            width = (WIDTH - 200) * count / peak
            bars.append(
                {
                    "verdict": verdict if series == 0 else None,
                    "y": y,
                    "text_y": y + line - 3,
                    "width": f"{width:.1f}",
                    "text_x": f"{172 + width:.1f}",
                    "height": line - 2,
                    "colour": BAR if series == 0 else BAR_AFTER,
                    "title": f"{labels[series]} {verdict}: {count}",
                    "count": count,
                }
            )
            y += line
        y += gap
    legend = [(label, BAR if i == 0 else BAR_AFTER) for i, label in enumerate(labels)] if len(labels) > 1 else []
    return {"width": WIDTH, "height": len(rows) * (line * len(labels) + gap) + 20, "bars": bars, "legend": legend}


@cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("regen.ui", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,  # a template's mistake fails its test, not silently blank
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        n=n, pct=pct, num=num, eta=eta, idle=idle, when=when, segment=segment, mapping=mapping, short=short
    )
    env.globals.update(
        query=query,
        row_plots=row_plots,
        comparison_plots=comparison_plots,
        cost_line=cost_line,
        trigger_conf=trigger_conf,
        previous_on_page=previous_on_page,
        airflow=AIRFLOW,
        dag_id=DAG_ID,
    )
    return env


@cache
def _asset(name: str) -> Markup:
    """The page's own stylesheet or script, as written: not a template, nothing from storage in it."""
    text = (resources.files("regen.ui") / "templates" / name).read_text()
    return Markup(text.replace("__DAG__", DAG_ID).replace("__AIRFLOW__", AIRFLOW))


def page(
    root: str,
    profile: str,
    overview: Overview,
    page_number: int = 0,
    comparison: dict[str, Any] | None = None,
    compare_error: str | None = None,
    version: dict[str, Any] | None = None,
    version_error: str | None = None,
) -> str:
    """The whole page: datasets (page `page_number` of their other versions), a version's report when one was asked
    for (`version`), a comparison, the runs in progress and the fleet button."""
    return (
        _environment()
        .get_template("page.html.j2")
        .render(
            root=root,
            profile=profile,
            datasets=overview.datasets,
            runs=overview.runs,
            page=page_number,
            comparison=comparison,
            compare_error=compare_error,
            version=version,
            version_error=version_error,
            style=_asset("page.css"),
            script=_asset("page.js"),
        )
    )
