"""report.html: one self-contained page per results folder (the spec, the tables, every figure embedded,
the Gantt charts, links to the Perfetto trace and the CSVs), and an index over many folders.

Figures are PNGs inlined as data: URIs, so the page can be mailed or archived alone; the CSVs and
trace.json it links to sit next to it.
"""

from __future__ import annotations

import base64
from html import escape
from pathlib import Path

import pandas as pd

from testbed import tables
from testbed.results import atomic_open

CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1300px;padding:0 1em;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.82em;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 6px;
text-align:right;white-space:nowrap}th{background:#f2f2f6;cursor:help}td:first-child,th:first-child{text-align:left}
caption{caption-side:bottom;text-align:left;font-size:.9em;color:#555;padding-top:3px}
.scroll{overflow-x:auto}figure{margin:1em 0}figure img{max-width:100%;border:1px solid #eee}
figcaption{font-size:.85em;color:#555}pre{background:#f7f7f7;padding:.6em;overflow-x:auto;font-size:.8em}
.note{color:#7a5b00}code{background:#f3f3f3;padding:0 3px}
"""

# Tables shown, in order: (file, title, html id)
TABLES = (("summary.csv", "Summary", "summary"), ("validation.csv", "Simulator vs emulator", "validation"),
          ("links.csv", "The emulated WAN: configured vs measured", "links"),
          ("backends.csv", "Backends compared", "backends"), ("plan.csv", "DC selection candidates", "plan"),
          ("scale.csv", "The WAN at scale k: what it does to a launched job's transfers", "scale"),
          ("check.csv", "A launched job's WAN transfers against the simulator's model", "check"))


def _png(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def _figure(path: Path, folder: Path) -> str:
    try:
        name = path.relative_to(folder)
    except ValueError:
        name = path.name
    return (f'<figure><img src="{_png(path)}" alt="{escape(str(name))}">'
            f"<figcaption>{escape(str(name))}</figcaption></figure>")


def _title(folder: Path) -> str:
    spec = folder / "spec.yaml"
    if spec.exists():
        import yaml

        data = yaml.safe_load(spec.read_text()) or {}
        if isinstance(data, dict) and data.get("name"):
            return str(data["name"])
    return folder.resolve().name


def _section(title: str, body: str) -> str:
    return f"<h2>{escape(title)}</h2>\n{body}\n"


def render(folder: Path, figures: list[Path], notes: list[str]) -> str:
    folder = Path(folder)
    parts = [f"<h1>{escape(_title(folder))}</h1>",
             f"<p>Results folder <code>{escape(str(folder))}</code>. Hover a column's name for its meaning "
             f"and unit; every column is described in docs/outputs.md.</p>"]
    spec = folder / "spec.yaml"
    if spec.exists():
        first = spec.read_text().splitlines()[0] if spec.read_text() else ""
        parts.append(_section("What was run", f"<p><code>{escape(first.lstrip('# '))}</code></p>"
                                              f'<details><summary><a href="spec.yaml">spec.yaml</a>: the experiment as '
                                              f"it ran</summary><pre>{escape(spec.read_text())}</pre></details>"))
    else:
        parts.append(_section("What was run", "<p>No spec.yaml here (written by runs of this version on).</p>"))
    for fname, title, ident in TABLES:
        f = folder / fname
        if not f.exists():
            continue
        df = pd.read_csv(f)
        v = tables.view(df, title, summary=fname == "summary.csv")
        body = f'<div class="scroll">{tables.html_table(v, ident)}</div><p><a href="{fname}">{fname}</a></p>'
        if fname == "summary.csv":
            full = tables.view(df, title, ["all"])
            body += (f'<details><summary>every column of summary.csv</summary><div class="scroll">'
                     f"{tables.html_table(full, ident + '-all')}</div></details>")
        parts.append(_section(title, body))
    parts += _health(folder)
    gantts = [p for p in figures if p.name.startswith("gantt_")]
    flows = [p for p in figures if p.name.startswith("wan_flows_")]
    rest = [p for p in figures if p not in gantts and p not in flows]
    if rest:
        parts.append(_section("Figures", "".join(_figure(p, folder) for p in rest)))
    if gantts:
        parts.append(_section("Gantt charts", "".join(_figure(p, folder) for p in gantts)))
    if flows:
        parts.append(_section("Who has the WAN", "".join(_figure(p, folder) for p in flows)))
    if notes:
        parts.append(_section("Not drawn", "<ul>" + "".join(f'<li class="note">{escape(n)}</li>' for n in notes)
                              + "</ul>"))
    trace = folder / "trace.json"
    if trace.exists():
        mb = trace.stat().st_size / 2**20
        parts.append(_section("Traces", f'<p><a href="trace.json">trace.json</a> ({mb:.1f} MiB): open '
                                        f'<a href="https://ui.perfetto.dev">ui.perfetto.dev</a> and choose '
                                        f"<i>Open trace file</i>: one process per run and DC, one thread per stage "
                                        f"and replica.</p>"))
    files = sorted(p.name for p in folder.iterdir() if p.is_file() and p.suffix in (".csv", ".json", ".yaml"))
    parts.append(_section("Files", "<p>" + " · ".join(f'<a href="{escape(n)}">{escape(n)}</a>' for n in files)
                          + "</p>"))
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escape(_title(folder))}</title>'
            f"<style>{CSS}</style></head><body>\n" + "\n".join(parts) + "\n</body></html>\n")


def _health(folder: Path) -> list[str]:
    """The emulated runs' timing health (summary.csv's health columns, testbed/emu/health.py), if it has them."""
    from testbed.analysis.metrics import HEALTH_COLUMNS

    f = folder / "summary.csv"
    if not f.exists():
        return []
    df = pd.read_csv(f)
    if "timing_error" not in df or "source" not in df:
        return []
    emu = df[df.source == "emu"]
    if emu.empty:
        return []
    cols = ["run_id", "scheduler", *[c for c in HEALTH_COLUMNS if c in emu], "degraded"]
    v = tables.view(emu, "Timing health", cols)
    bad = int((emu.degraded.fillna("").astype(str) != "").sum())
    say = (f"{bad} of {len(emu)} emulated runs degraded: their numbers should not be used"
           if bad else f"every emulated run kept its timing budget ({len(emu)} runs)")
    body = (f'<p class="{"note" if bad else ""}">{escape(say)} (docs/reliability.md).</p>'
            f'<div class="scroll">{tables.html_table(v, "health")}</div>')
    return [_section("Timing health", body)]


def has_results(folder: Path) -> bool:
    return any((folder / f).exists() for f, _t, _i in TABLES)


def write_report(folder: Path, figures: Path | None = None, notes: list[str] | None = None) -> Path:
    """Draw the folder's figures (into `figures`, default FOLDER/figures) and write FOLDER/report.html."""
    from testbed.figures.draw import draw_all

    folder = Path(folder)
    notes = notes if notes is not None else []
    paths = draw_all(folder, figures or folder / "figures", notes)
    out = folder / "report.html"
    with atomic_open(out) as f:
        f.write(render(folder, paths, notes))
    return out


def write_index(root: Path) -> Path:
    """ROOT/index.html: a link to every report.html under ROOT, with its title and summary caption."""
    root = Path(root)
    items = []
    for rep in sorted(root.rglob("report.html")):
        folder = rep.parent
        cap = ""
        if (folder / "summary.csv").exists():
            df = pd.read_csv(folder / "summary.csv")
            v = tables.view(df, "")
            cap = f"{len(df)} rows; {v.caption}" if v.caption else f"{len(df)} rows"
        rel = rep.relative_to(root)
        items.append(f'<li><a href="{escape(str(rel))}">{escape(_title(folder))}</a> '
                     f"<code>{escape(str(rel.parent))}</code><br><small>{escape(cap)}</small></li>")
    html = (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>results</title><style>{CSS}</style>'
            f"</head><body><h1>Results in {escape(str(root))}</h1><ul>{''.join(items)}</ul></body></html>\n")
    out = root / "index.html"
    with atomic_open(out) as f:
        f.write(html)
    return out
