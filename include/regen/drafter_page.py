"""The "Drafter data" page as HTML: the catalog's numbers in tables, plots as inline SVG, no script library.

Pure functions of the catalog's dictionaries (regen.catalog), so the page is tested without a browser or Airflow.
Links into Airflow's UI target the top window: the page is shown inside Airflow's UI, in a frame.
"""

from __future__ import annotations

import html
import json
from typing import Any
from urllib.parse import quote, urlencode

DAG_ID = "eagle3_regen"
# Airflow's own pages and API, relative to the page's URL (Airflow's base URL + /drafter/): under a base_url with a
# path prefix they are found as well.
AIRFLOW = "../"
BAR = "#4c78a8"
BAR_AFTER = "#f58518"
WIDTH, HEIGHT = 360, 120


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _n(value: Any, spec: str = "") -> str:
    """A number in the format `spec`. Whatever else a file holds where a number belongs (another schema, or a value
    someone wrote into the bucket) is escaped text: nothing read from storage reaches the HTML unescaped."""
    if value is None:
        return "-"
    return format(value, spec) if _number(value) else esc(value)


def _pct(value: Any) -> str:
    return _n(100 * value, ".1f") + "%" if _number(value) else _n(value)


def _num(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1 else f"{value:,.1f}"
    return _n(value, ",")


def _eta(seconds: Any) -> str:
    if not _number(seconds):
        return _n(seconds)
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _legend(labels: list[str]) -> str:
    """Each version's name in its bars' colour."""
    colours = (BAR, BAR_AFTER)
    return " vs ".join(f'<tspan fill="{colours[i]}">{esc(label)}</tspan>' for i, label in enumerate(labels))


def svg_histogram(histograms: list[tuple[str, dict[str, Any]]], title: str) -> str:
    """Bars of one or two histograms (before, after) as inline SVG, on one token axis: each version's bins keep their
    own edges, placed by token count, so versions with different longest answers still line up."""
    shown = [(label, h) for label, h in histograms if _numbers(h)]
    if not shown:
        return f'<p class="none">{esc(title)}: no histogram in this version\'s report</p>'
    top = max(h["edges"][-1] for _, h in shown) or 1.0
    peak = max(max(h["counts"]) for _, h in shown) or 1
    scale = (WIDTH - 40) / top
    bars = []
    for series, (label, h) in enumerate(shown):
        colour = BAR if series == 0 else BAR_AFTER
        edges = h["edges"]
        for i, count in enumerate(h["counts"]):
            width = (edges[i + 1] - edges[i]) * scale / len(shown)
            height = (HEIGHT - 30) * count / peak
            x = 30 + edges[i] * scale + series * width
            bars.append(
                f'<rect x="{x:.1f}" y="{HEIGHT - 20 - height:.1f}" width="{max(width - 1, 1):.1f}" '
                f'height="{height:.1f}" fill="{colour}"><title>{esc(label)} {edges[i]:.0f}-{edges[i + 1]:.0f}: '
                f"{count}</title></rect>"
            )
    legend = f" ({_legend([label for label, _ in shown])})" if len(shown) > 1 else ""  # one: its row names it
    return (
        f'<svg class="plot" role="img" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'aria-label="{esc(title)}"><text x="30" y="12" font-size="11">{esc(title)}{legend}</text>'
        f'{"".join(bars)}<text x="30" y="{HEIGHT - 5}" font-size="10">0</text>'
        f'<text x="{WIDTH - 10}" y="{HEIGHT - 5}" font-size="10" text-anchor="end">{top:.0f} tokens</text>'
        "</svg>"
    )


def _numbers(histogram: Any) -> bool:
    """A histogram whose counts and edges are lists of numbers, one edge more than counts."""
    if not isinstance(histogram, dict):
        return False
    counts, edges = histogram.get("counts"), histogram.get("edges")
    if not (isinstance(counts, list) and isinstance(edges, list) and counts and len(edges) == len(counts) + 1):
        return False
    return all(_number(v) for v in counts + edges)


def svg_verdicts(rows: list[tuple[str, list[int]]], labels: list[str]) -> str:
    """Horizontal bars, one group per verdict (one bar per version compared)."""
    rows = [(verdict, [c if _number(c) else 0 for c in counts]) for verdict, counts in rows]
    if not rows:
        return '<p class="none">no verdicts</p>'
    peak = max(max(counts) for _, counts in rows) or 1
    line, gap = 12, 6
    height = len(rows) * (line * len(labels) + gap) + 20
    parts = []
    y = 16
    for verdict, counts in rows:
        for series, count in enumerate(counts):
            colour = BAR if series == 0 else BAR_AFTER
            width = (WIDTH - 200) * count / peak
            parts.append(
                f'<rect x="170" y="{y}" width="{width:.1f}" height="{line - 2}" fill="{colour}">'
                f"<title>{esc(labels[series])} {esc(verdict)}: {count}</title></rect>"
                f'<text x="{172 + width:.1f}" y="{y + line - 3}" font-size="10">{count}</text>'
            )
            if series == 0:
                parts.append(f'<text x="0" y="{y + line - 3}" font-size="11">{esc(verdict)}</text>')
            y += line
        y += gap
    return (
        f'<svg class="plot" role="img" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" '
        f'aria-label="verdicts"><text x="0" y="11" font-size="11">verdicts'
        f"{f' ({_legend(labels)})' if len(labels) > 1 else ''}</text>{''.join(parts)}</svg>"
    )


def _links(row: dict[str, Any]) -> str:
    links = [f'<a href="{esc(row["manifest"])}">manifest</a>'] if row.get("manifest") else []
    if row.get("report"):
        links.append(f'<a href="{esc(row["report"])}">report</a>')
    if row.get("run_id"):
        links.append(
            f'<a target="_top" href="{AIRFLOW}dags/{DAG_ID}/runs/{esc(quote(str(row["run_id"]), safe=""))}">run</a>'
        )
    return " ".join(links)


def _rejections(row: dict[str, Any]) -> str:
    reasons = row.get("rejected_by_reason") or {}
    listed = ", ".join(f"{esc(reason)} {_n(count)}" for reason, count in reasons.items())
    return f'{_num(row.get("rejected"))}<div class="small">{listed}</div>' if reasons else _num(row.get("rejected"))


def _drift(row: dict[str, Any]) -> str:
    drift = row.get("retokenize_drift") or {}
    if not isinstance(drift, dict) or not drift.get("sampled"):
        return "-"
    return f"{_n(drift.get('drifted'))}/{_n(drift['sampled'])}"


def _version_cells(row: dict[str, Any]) -> str:
    tokens = row.get("tokens") or {}
    template = (row.get("template_sha256") or "")[:12]
    return (
        f'<td>{esc(row["version"])}</td><td class="n records">{_num(row.get("records"))}</td>'
        f"<td class=n>{_rejections(row)}</td><td class=n>{_pct(row.get('truncation_rate'))}</td>"
        f"<td class=n>{_pct(row.get('tool_call_rate'))}</td><td class=n>{_drift(row)}</td>"
        f"<td class=n>{_num(tokens.get('prompt'))} / {_num(tokens.get('output'))}{_cost(row)}</td>"
        f"<td>{esc(row.get('profile'))}<div class=small>{esc(template)}</div></td>"
        f"<td>{esc(str(row.get('published_at') or '')[:19].replace('T', ' '))}</td><td>{_links(row)}</td>"
    )


def _cost(row: dict[str, Any]) -> str:
    """Prefix-cache share and GPU-hours under the token totals; the cost per 1M training tokens with a price."""
    cost = row.get("cost") or {}
    parts = []
    if cost.get("cached_share") is not None:
        parts.append(f"{_pct(cost['cached_share'])} cached")
    if cost.get("gpu_hours") is not None:
        parts.append(f"{_n(cost['gpu_hours'], '.3g')} GPU-h")
    if cost.get("cost_per_million_train_tokens") is not None:
        parts.append(f"{_n(cost['cost_per_million_train_tokens'], '.4g')} {esc(cost.get('currency'))}/1M tokens")
    return f'<div class="small">{", ".join(parts)}</div>' if parts else ""


HEADER = (
    "<tr><th>dataset</th><th>version</th><th>records</th><th>rejected</th><th>truncated</th><th>tool calls</th>"
    "<th>drift</th><th>prompt / output tokens</th><th>profile, template</th><th>published</th><th></th><th></th></tr>"
)


def _regenerate_button(dataset: str, version: str | None = None) -> str:
    conf: dict[str, Any] = {"datasets": [dataset]}
    label = "Regenerate"
    if version is not None:
        conf["version"] = version
        label = "Resume"
    return f"<button class=trigger data-dataset=\"{esc(dataset)}\" data-conf='{esc(json.dumps(conf))}'>{label}</button>"


def _compare_query(dataset: str, before: dict[str, Any], after: dict[str, Any]) -> str:
    """The page's own query for comparing two versions, escaped for an attribute."""
    return esc(urlencode({"compare": dataset, "before": before["version"], "after": after["version"]}))


def datasets_section(rows: list[dict[str, Any]]) -> str:
    body = []
    for entry in rows:
        dataset, latest, versions = entry["dataset"], entry["latest"], entry["versions"]
        cells = _version_cells(latest) if latest else '<td colspan="10" class="none">no published version</td>'
        published = [v for v in versions if v["state"] == "published"]
        compare = (
            f'<a class="compare" href="?{_compare_query(dataset, published[1], published[0])}#compare">'
            "compare with previous</a>"
            if len(published) > 1
            else ""
        )
        body.append(
            f'<tr class="dataset" data-dataset="{esc(dataset)}"><td><b>{esc(dataset)}</b></td>{cells}'
            f"<td>{_regenerate_button(dataset)} {compare}</td></tr>"
        )
        if latest is not None:
            hist, label = latest.get("histograms", {}), latest["version"]
            plots = [svg_histogram([(label, hist.get(name, {}))], f"{name} length") for name in ("output", "prompt")]
            plots.append(svg_verdicts([(v, [c]) for v, c in latest.get("verdicts", {}).items()], [label]))
            body.append(f'<tr class="plots"><td></td><td colspan="11">{"".join(plots)}</td></tr>')
        older = [v for v in versions if v is not latest]
        if older:
            items = []
            for version in older:
                if version["state"] == "published":
                    after = published.index(version)
                    compare = (
                        f'<a href="?{_compare_query(dataset, published[after + 1], version)}#compare">'
                        "compare with previous</a>"
                        if after + 1 < len(published)
                        else ""
                    )
                    items.append(f"<tr><td></td>{_version_cells(version)}<td>{compare}</td></tr>")
                else:
                    items.append(
                        f"<tr><td></td><td>{esc(version['version'])}</td><td colspan=9>{esc(version['state'])}: "
                        + (
                            esc(version["error"])
                            if "error" in version
                            else f"{_n(version['done'])}/{_n(version['prompts'])} answered"
                        )
                        + f"</td><td>{_regenerate_button(dataset, version['version'])}</td></tr>"
                    )
            body.append(
                f'<tr class="older"><td></td><td colspan="11"><details><summary>{len(older)} other version(s)</summary>'
                f"<table>{''.join(items)}</table></details></td></tr>"
            )
    return f'<section id="datasets"><h2>Datasets</h2><table class="grid">{HEADER}{"".join(body)}</table></section>'


def compare_section(comparison: dict[str, Any] | None, error: str | None = None) -> str:
    if comparison is None:
        hint = esc(error) if error else "Pick two versions: the compare link beside a dataset or a version."
        return f'<section id="compare"><h2>Compare</h2><p class="none">{hint}</p></section>'
    a, b = comparison["before"], comparison["after"]
    labels = [a["version"], b["version"]]
    rows = "".join(
        f"<tr><td>{esc(key)}</td><td class=n>{_num(a.get(key))}</td><td class=n>{_num(b.get(key))}</td>"
        f"<td class=n>{_num(change)}</td></tr>"
        for key, change in comparison["changes"].items()
    )
    lengths = "".join(
        f"<tr><td>{esc(name)} p50 / p90 / p99</td>"
        + "".join(
            f"<td class=n>{' / '.join(_num((side or {}).get(p)) for p in ('p50', 'p90', 'p99'))}</td>"
            for side in (sides["before"], sides["after"])
        )
        + "<td></td></tr>"
        for name, sides in comparison["lengths"].items()
    )
    histograms = "".join(
        svg_histogram(
            [(a["version"], a["histograms"].get(name, {})), (b["version"], b["histograms"].get(name, {}))],
            f"{name} length",
        )
        for name in ("output", "prompt")
    )
    verdicts = svg_verdicts([(v["verdict"], [v["before"], v["after"]]) for v in comparison["verdicts"]], labels)
    return (
        f'<section id="compare"><h2>Compare {esc(comparison["dataset"])}: {esc(labels[0])} vs {esc(labels[1])}</h2>'
        f'<table class="grid"><tr><th></th><th>{esc(labels[0])}</th><th>{esc(labels[1])}</th><th>change</th></tr>'
        f"{rows}{lengths}</table>{histograms}{verdicts}</section>"
    )


def runs_section(versions: list[dict[str, Any]]) -> str:
    if not versions:
        return '<section id="runs"><h2>Runs in progress</h2><p class="none">nothing unpublished</p></section>'
    blocks = []
    for v in versions:
        shards = "".join(
            f"<tr><td>{esc(s['shard'])}</td><td>{esc(s['state'])}</td>"
            f'<td><progress max="{_n(s["total"])}" value="{_n(s["done"])}"></progress> {_n(s["done"])}/{_n(s["total"])}'
            f"</td><td class=n>{_n(s.get('requests_per_s'))}</td><td class=n>{_eta(s.get('eta_s'))}</td>"
            f"<td>{esc(', '.join(f'{k} {n}' for k, n in (s.get('retries_by_cause') or {}).items()) or '-')}</td>"
            f"<td class=n>{_n(s.get('in_flight'))}/{_n(s.get('concurrency'))}</td></tr>"
            for s in v["shards"]
        )
        blocks.append(
            f"<h3>{esc(v['dataset'])} {esc(v['version'])} ({esc(v['state'])}): {_n(v['done'])}/{_n(v['prompts'])} "
            f"answered, {_n(v['requests_per_s'])} req/s, ETA {_eta(v['eta_s'])}, "
            f"fleet in use {_pct(v['utilisation'])}</h3>"
            f"<p>{_regenerate_button(v['dataset'], v['version'])} {_links(v)}</p>"
            '<table class="grid"><tr><th>shard</th><th>state</th><th>done</th><th>req/s</th><th>ETA</th>'
            f"<th>retries by cause</th><th>in flight</th></tr>{shards}</table>"
        )
    return f'<section id="runs"><h2>Runs in progress</h2>{"".join(blocks)}</section>'


FLEET = """<section id="fleet"><h2>Fleet</h2>
<p><button id="fleet-check">Check the fleet</button> <span class=small>asks each configured endpoint now
(/health, model, version, context length, running requests), with a short timeout</span></p>
<table class="grid" id="fleet-table"></table></section>"""

STYLE = """body{font:13px system-ui,sans-serif;margin:12px;max-width:1500px}table.grid{border-collapse:collapse}
.grid td,.grid th{border-bottom:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}
.n{text-align:right}.small{font-size:11px;color:#555}.none{color:#777}svg.plot{margin:4px 12px 4px 0}
dialog pre{background:#f4f4f4;padding:6px}h2{margin-top:24px}"""

SCRIPT = """
const api = (path) => new URL(path, document.baseURI);
document.querySelectorAll('button.trigger').forEach((button) => button.addEventListener('click', () => {
  const dialog = document.getElementById('trigger-dialog');
  dialog.querySelector('pre').textContent = JSON.stringify(JSON.parse(button.dataset.conf), null, 1);
  dialog.querySelector('.dataset').textContent = button.dataset.dataset;
  dialog.querySelector('.outcome').textContent = '';
  dialog.showModal();
}));
document.getElementById('trigger-copy').addEventListener('click', async () => {
  const conf = document.querySelector('#trigger-dialog pre').textContent;
  try { await navigator.clipboard.writeText(conf); } catch (e) { /* the JSON stays on screen to copy by hand */ }
  window.open(new URL('__AIRFLOW__dags/__DAG__', document.baseURI), '_top');
});
document.getElementById('trigger-now').addEventListener('click', async () => {
  const dialog = document.getElementById('trigger-dialog');
  const conf = JSON.parse(dialog.querySelector('pre').textContent);
  // Airflow's own REST API, with the signed-in user's session: Airflow checks that this user may trigger the DAG.
  const answer = await fetch(api('__AIRFLOW__api/v2/dags/__DAG__/dagRuns'), {method: 'POST', credentials: 'same-origin',
    headers: {'Content-Type': 'application/json'}, body: JSON.stringify({logical_date: null, conf})});
  const body = await answer.json().catch(() => ({}));
  const outcome = dialog.querySelector('.outcome');
  if (answer.ok) {
    outcome.innerHTML = '';
    const link = Object.assign(document.createElement('a'), {target: '_top', textContent: body.dag_run_id,
      href: api('__AIRFLOW__dags/__DAG__/runs/' + encodeURIComponent(body.dag_run_id))});
    outcome.append('Triggered ', link);
  } else {
    outcome.textContent = 'Refused (' + answer.status + '): ' + JSON.stringify(body.detail ?? body);
  }
});
document.getElementById('fleet-check').addEventListener('click', async () => {
  const table = document.getElementById('fleet-table');
  table.textContent = 'asking...';
  const fleet = await (await fetch(api('api/fleet'), {credentials: 'same-origin'})).json();
  const cells = (values, tag) => values.map((v) => { const c = document.createElement(tag);
    c.textContent = v ?? '-'; return c; });
  const head = document.createElement('tr');
  const names = ['endpoint', 'health', 'model', 'version', 'context length', 'running', 'slots', 'error'];
  head.append(...cells(names, 'th'));
  table.replaceChildren(head);
  for (const e of fleet) {
    const row = document.createElement('tr');
    row.append(...cells([e.url, e.health, e.model, e.version, e.context_length, e.running_requests,
      e.max_running_requests, e.error], 'td'));
    table.append(row);
  }
});
""".replace("__DAG__", DAG_ID).replace("__AIRFLOW__", "../")

DIALOG = """<dialog id="trigger-dialog"><h3>Run <span class="dataset"></span> again</h3>
<p>The run's settings (the rest are the DAG's defaults):</p><pre></pre>
<p><button id="trigger-now">Trigger now</button> as you, through Airflow's API &nbsp; or
<button id="trigger-copy">Open Airflow's trigger form</button> (the settings are copied: paste them into its
configuration JSON)</p><p class="outcome"></p><form method="dialog"><button>Close</button></form></dialog>"""


def page(
    root: str,
    profile: str,
    datasets: list[dict[str, Any]],
    runs: list[dict[str, Any]],
    comparison: dict[str, Any] | None,
    compare_error: str | None = None,
) -> str:
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Drafter data</title>'
        f"<style>{STYLE}</style></head><body><h1>Drafter data</h1>"
        f'<p class="small">storage {esc(root)}, profile {esc(profile)}. '
        '<a href="#datasets">Datasets</a> &middot; <a href="#compare">Compare</a> &middot; '
        '<a href="#runs">Runs in progress</a> &middot; <a href="#fleet">Fleet</a></p>'
        f"{datasets_section(datasets)}{compare_section(comparison, compare_error)}{runs_section(runs)}{FLEET}"
        f"{DIALOG}<script>{SCRIPT}</script></body></html>"
    )
