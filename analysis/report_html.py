"""report/index.html: one self-contained page (inline CSS, SVG and a few lines of JS, nothing
fetched) with the findings, step times and breakdowns per rank, top kernels, Python functions
and communication, so it works offline and can be mailed around as one file."""
from __future__ import annotations

import html
from typing import Any

import numpy as np
import pandas as pd

from stepscope.analysis.model import Diagnosis
from stepscope.analysis.causes import WAITING
from stepscope.analysis.rank_tables import MAIN_THREAD, RankTables
from stepscope.analysis.slow_workers import kernel_ratios
from stepscope.analysis.wording import function_text, ranks_text, short

_CSS = """
:root{--fg:#1d2330;--muted:#667085;--line:#e4e7ec;--bg:#f7f8fa;--card:#fff;--crit:#c0362c;--warn:#b7791f;--info:#2b6cb0;
--c1:#3b82f6;--c2:#ef4444;--c3:#f59e0b;--c4:#10b981;--c5:#9ca3af}
*{box-sizing:border-box}body{margin:0;font:14px/1.45 -apple-system,BlinkMacSystemFont,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;color:var(--fg);background:var(--bg)}
header{background:#111827;color:#fff;padding:18px 32px}header h1{margin:0;font-size:20px;font-weight:600}header .meta{color:#9ca3af;font-size:12px;margin-top:4px}
main{max-width:1200px;margin:0 auto;padding:20px 32px 60px}
.summary{font-size:17px;font-weight:600;background:var(--card);border-left:5px solid var(--info);padding:14px 18px;border-radius:6px;box-shadow:0 1px 2px rgba(0,0,0,.06)}
.summary.critical{border-color:var(--crit)}.summary.warning{border-color:var(--warn)}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(170px,1fr));gap:12px;margin:16px 0}
.card{background:var(--card);border-radius:6px;padding:12px 14px;box-shadow:0 1px 2px rgba(0,0,0,.06)}.card .k{color:var(--muted);font-size:12px}.card .v{font-size:20px;font-weight:600}
section{background:var(--card);border-radius:6px;padding:16px 18px;margin:16px 0;box-shadow:0 1px 2px rgba(0,0,0,.06)}
h2{font-size:15px;margin:0 0 10px}h3{font-size:14px;margin:14px 0 4px}p.note{color:var(--muted);font-size:12px;margin:6px 0 0}
table{border-collapse:collapse;width:100%;font-size:13px}th,td{text-align:left;padding:6px 8px;border-bottom:1px solid var(--line);vertical-align:top}
th{color:var(--muted);font-weight:600;cursor:pointer;user-select:none;white-space:nowrap}td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.name{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12px;word-break:break-all}
.sev{display:inline-block;padding:1px 8px;border-radius:10px;font-size:11px;font-weight:600;color:#fff}.sev.critical{background:var(--crit)}.sev.warning{background:var(--warn)}.sev.info{background:var(--info)}
.legend span{display:inline-block;margin-right:14px;font-size:12px;color:var(--muted)}.legend i{display:inline-block;width:10px;height:10px;margin-right:5px;border-radius:2px}
svg text{font-size:11px;fill:#667085}.bar:hover{opacity:.75}tr.slow td{background:#fff5f5}
"""

_JS = """
document.querySelectorAll('table.sortable th').forEach(function(th,i){th.addEventListener('click',function(){
var tb=th.closest('table').tBodies[0],rows=Array.from(tb.rows),asc=th.dataset.asc!=='1';th.dataset.asc=asc?'1':'0';
rows.sort(function(a,b){var x=a.cells[i].dataset.v||a.cells[i].textContent,y=b.cells[i].dataset.v||b.cells[i].textContent,
p=parseFloat(x),q=parseFloat(y);var c=(!isNaN(p)&&!isNaN(q))?p-q:x.localeCompare(y);return asc?c:-c;});rows.forEach(function(r){tb.appendChild(r);});});});
"""

_SEGMENTS = (("computingUs", "compute", "var(--c1)"), ("commNotOverlappedUs", "communication not overlapped", "var(--c2)"),
             ("overlappedUs", "communication overlapped", "var(--c4)"), ("freeUs", "free (idle)", "var(--c5)"))


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value: float, digits: int = 1) -> str:
    return "–" if value is None or (isinstance(value, float) and np.isnan(value)) else f"{value:,.{digits}f}"


def _ticks(top: float) -> list[float]:
    """Round axis ticks (1, 2, 2.5 or 5 times a power of ten) from 0 up to at least `top`."""
    raw = top / 4 if top > 0 else 1.0
    power = 10 ** np.floor(np.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    return [i * step for i in range(int(np.ceil(top / step)) + 1)]


def _bar_chart(labels: list[str], values: np.ndarray, highlight: set[int], unit: str, reference: float | None = None, ref_label: str = "median") -> str:
    """Vertical bars, one per rank; highlighted ones in red; a dashed reference line."""
    finite = np.isfinite(values)
    if not finite.any():
        return '<p class="note">no data</p>'
    width, height, left, bottom = 1100, 220, 56, 24
    ticks = _ticks(max(float(values[finite].max()), 0.0) * 1.05 or 1.0)
    top = ticks[-1]
    n = len(values)
    slot = (width - left - 10) / n
    bar = max(1.0, slot * 0.8)
    parts = [f'<svg viewBox="0 0 {width} {height + bottom}" width="100%" role="img">']
    for tick in ticks:
        y = height - tick / top * (height - 10)
        parts.append(f'<line x1="{left}" x2="{width - 10}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eef0f3"/>'
                     f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{tick:,.{0 if ticks[1] >= 1 else 2}f}</text>')
    for i, (label, value) in enumerate(zip(labels, values)):
        if not finite[i]:
            continue
        h = value / top * (height - 10)
        x = left + i * slot + (slot - bar) / 2
        colour = "var(--c2)" if i in highlight else "var(--c1)"
        parts.append(f'<rect class="bar" x="{x:.1f}" y="{height - h:.1f}" width="{bar:.1f}" height="{h:.1f}" fill="{colour}"><title>{_e(label)}: {_num(value, 2)} {unit}</title></rect>')
    every = max(1, int(np.ceil(n / 40)))
    for i in range(0, n, every):
        parts.append(f'<text x="{left + i * slot + slot / 2:.1f}" y="{height + 15}" text-anchor="middle">{_e(labels[i].removeprefix("rank "))}</text>')
    if reference is not None and reference > 0:
        y = height - reference / top * (height - 10)
        parts.append(f'<line x1="{left}" x2="{width - 10}" y1="{y:.1f}" y2="{y:.1f}" stroke="#111827" stroke-dasharray="5 4"/>'
                     f'<text x="{width - 12}" y="{y - 4:.1f}" text-anchor="end">{_e(ref_label)} {_num(reference, 2)} {unit}</text>')
    parts.append(f'<text x="14" y="{height / 2}" transform="rotate(-90 14 {height / 2})" text-anchor="middle">{_e(unit)}</text></svg>')
    return "".join(parts)


def _collective_share_chart(tables: RankTables, step_total_us: pd.Series) -> str:
    """CPU-only traces: the share of each rank's steps spent in collectives (the rank with the
    lowest share is the one the others wait for)."""
    c = tables.collectives
    if c.empty:
        return '<p class="note">no GPU time and no collectives to break the steps down by</p>'
    share = (100.0 * tables.collective_share()).reindex(step_total_us.index).fillna(0.0)
    return ('<p class="note">No GPU work in these traces: share of each rank\'s steps spent in collectives '
            '(the rank that spends least there is the one the others wait for).</p>'
            + _bar_chart([f"rank {r}" for r in share.index], share.to_numpy(), set(), "% in collectives"))


def _stacked_chart(tables: RankTables) -> str:
    s = tables.steps
    if s.empty or s["durationUs"].sum() <= 0:
        return '<p class="note">no steps in the traces</p>'
    per = s.groupby("rank")[[c for c, _, _ in _SEGMENTS] + ["durationUs", "stageUs"]].sum()
    if not per[[c for c, _, _ in _SEGMENTS]].to_numpy().any():
        return _collective_share_chart(tables, per["durationUs"])
    width, height, left, bottom = 1100, 200, 56, 24
    slot = (width - left - 10) / len(per)
    bar = max(1.0, slot * 0.8)
    parts = [f'<svg viewBox="0 0 {width} {height + bottom}" width="100%" role="img">']
    for frac in (0, 0.5, 1.0):
        y = height - frac * (height - 10)
        parts.append(f'<line x1="{left}" x2="{width - 10}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eef0f3"/><text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{frac * 100:.0f}%</text>')
    for i, (rank, row) in enumerate(per.iterrows()):
        total = row["stageUs"] or 1.0
        y = float(height)
        x = left + i * slot + (slot - bar) / 2
        for column, label, colour in _SEGMENTS:
            h = min(row[column] / total, 1.0) * (height - 10)
            y -= h
            parts.append(f'<rect class="bar" x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{h:.1f}" fill="{colour}"><title>rank {rank}: {label} {100 * row[column] / total:.1f}%</title></rect>')
    every = max(1, int(np.ceil(len(per) / 40)))
    for i in range(0, len(per), every):
        parts.append(f'<text x="{left + i * slot + slot / 2:.1f}" y="{height + 15}" text-anchor="middle">{per.index[i]}</text>')
    parts.append("</svg>")
    legend = "".join(f'<span><i style="background:{c}"></i>{_e(label)}</span>' for _, label, c in _SEGMENTS)
    return f'<div class="legend">{legend}</div>' + "".join(parts)


def _table(headers: list[str], rows: list[list[tuple[str, str]]], row_classes: list[str] | None = None) -> str:
    """rows: cells as (kind, text) with kind "n" (number), "name" or ""."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{row_classes[i]}"' if row_classes and row_classes[i] else ""
        body.append(f"<tr{cls}>" + "".join(f'<td class="{k}">{t}</td>' for k, t in row) + "</tr>")
    return f'<table class="sortable"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def _findings(full: list[dict[str, Any]], limit: int = 50) -> str:
    if not full:
        return '<p class="note">nothing to report</p>'
    rows = [[("", f'<span class="sev {_e(f["severity"])}">{_e(f["severity"])}</span>'), ("", _e(f["category"])),
             ("", _e(ranks_text(f["ranks"]).removeprefix("ranks ").removeprefix("rank ") if f["ranks"] else "")), ("", _e(f["message"]))] for f in full[:limit]]
    more = f'<p class="note">{len(full) - limit} more findings in diagnosis.json</p>' if len(full) > limit else ""
    return _table(["severity", "category", "ranks", "finding"], rows) + more


def _slow_workers(full: list[dict[str, Any]]) -> str:
    """Each slow worker's evidence: the kernels that cost it most, by how much, and its votes."""
    parts = []
    for f in (f for f in full if f["category"] == "slow-worker" and f["ranks"]):
        d = f["data"]
        facts = [f"slowdown {d['slowdown']:.2f}x"] if "slowdown" in d else []
        if d.get("confidence") is not None:
            facts.append(f"confidence {d['confidence']:.2f}")
        if d.get("cause"):
            facts.append(f"cause {function_text(d['cause']['function'])}: +{d['cause']['excessUsPerStep'] / 1000:,.1f} ms/step")
        if d.get("stepRatio"):
            facts.append(f"step time {d['stepRatio']:.2f}x its peers")
        if d.get("kernelRatio"):
            facts.append(f"kernel time {d['kernelRatio']:.2f}x its peers")
        if d.get("voteShare"):
            facts.append(f"last at {d['votes']} of {d['rounds']} matched collectives; others wait {d['peersWaitUsPerStep'] / 1000:,.1f} ms/step")
        rows = [[("name", f'<span title="{_e(k["name"])}">{_e(short(k["name"], 90))}</span>'), ("", _e(k["type"])),
                 ("n", f'{k["ratio"]:.2f}x'), ("n", _num(k["excessUsPerStep"] / 1000, 2))] for k in d.get("slowKernels", [])]
        table = _table(["kernel", "type", "time vs peers", "extra ms/step"], rows) if rows else ""
        parts.append(f'<h3>rank {f["ranks"][0]}</h3><p class="note">{_e("; ".join(facts))}</p>{table}')
    return f'<section><h2>Slow workers</h2>{"".join(parts)}</section>' if parts else ""


def _hangs(full: list[dict[str, Any]]) -> str:
    """Where each rank that reported a hang is stuck, culprits first, with its main-thread stack."""
    hangs = [f for f in full if f["category"] == "hang" and "stuckAt" in f["data"]]
    if not hangs:
        return ""
    data = hangs[0]["data"]
    culprits = {r for f in hangs if "culprit" in f["message"] for r in f["ranks"]}
    order = sorted(data["stuckAt"], key=lambda r: (int(r) not in culprits, int(r)))
    rows = [[("n", _e(r)), ("", "culprit" if int(r) in culprits else ""), ("name", _e(data["stuckAt"][r])),
             ("name", f'<details><summary>stack</summary>{_e(data["stacks"].get(r, "")).replace(" &gt; ", "<br>")}</details>')] for r in order]
    return f'<section><h2>Where each rank is stuck</h2>{_table(["rank", "", "innermost user frame", "main thread (outermost first)"], rows, ["slow" if int(r) in culprits else "" for r in order])}</section>'


def _kernels(op_statistic: pd.DataFrame, limit: int = 20) -> str:
    if op_statistic.empty:
        return '<p class="note">no GPU kernels in the traces</p>'
    rows = [[("name", f'<span title="{_e(r["OP Type"])}">{_e(short(str(r["OP Type"]), 90))}</span>'), ("", _e(r["Core Type"])), ("n", f'{int(r["Count"]):,}'), ("n", _num(r["Total Time(us)"] / 1000, 2)),
             ("n", _num(r["Avg Time(us)"], 1)), ("n", _num(r["Ratio(%)"], 1)), ("n", str(int(r["Ranks"])))] for _, r in op_statistic.head(limit).iterrows()]
    return _table(["kernel (hover for the full name)", "type", "count", "total ms", "avg us", "share %", "ranks"], rows)


def _functions(tables: RankTables, limit: int = 20) -> str:
    """Exclusive time per step by thread, the training thread first: another thread's time runs
    beside the step, not in it, and time a thread waits (locks, collectives) is marked as such."""
    f = tables.functions
    if f.empty:
        return '<p class="note">no Python functions in the traces (capture with withStack)</p>'
    # A function called from several stacks has several rows per rank: one per rank first.
    f = f.assign(msPerStep=tables.per_step(f, "exclusiveUs") / 1000.0).groupby(["thread", "name", "rank"], as_index=False)["msPerStep"].sum()
    g = f.groupby(["thread", "name"])["msPerStep"]
    stats = pd.DataFrame({"median": g.median(), "max": g.max(), "ranks": g.count(), "worst": f.loc[g.idxmax(), "rank"].to_numpy()}).reset_index()
    stats["training"] = stats["thread"] == MAIN_THREAD
    stats = stats.sort_values(["training", "max"], ascending=False)
    stats = pd.concat([stats[stats["training"]].head(limit), stats[~stats["training"]].head(limit)])
    rows = [[("", _e(r["thread"] if r["thread"] == MAIN_THREAD else f"thread {function_text(r['thread'])}")),
             ("name", _e(function_text(str(r["name"]))) + (' <span class="note">(waiting)</span>' if WAITING.search(str(r["name"])) else "")),
             ("n", _num(r["median"], 2)), ("n", _num(r["max"], 2)), ("n", str(int(r["worst"]))), ("n", str(int(r["ranks"])))]
            for _, r in stats.iterrows()]
    own = tables.ownUs.sum() / max(float(tables.ranks["steps"].clip(lower=1).sum()), 1.0) / 1000.0 if len(tables.ownUs) else 0.0
    note = f'<p class="note">stepscope\'s agent and the profiler: {own:,.2f} ms/step per rank on the training thread, left out</p>' if own else ""
    return _table(["thread", "function (exclusive time)", "median ms/step", "max ms/step", "max on rank", "ranks"], rows) + note


def _communication(communication: pd.DataFrame) -> str:
    if communication.empty:
        return '<p class="note">no collectives in the traces</p>'
    g = communication.groupby("Collective")
    bandwidth = communication["Bus Bandwidth(GB/s)"].where(communication["Bus Bandwidth(GB/s)"] > 0)  # 0: the trace has no message sizes
    stats = pd.DataFrame({"count": g["Count"].median(), "median": g["Median Time(us)"].median(), "bwmin": bandwidth.groupby(communication["Collective"]).min(),
                          "bwmed": bandwidth.groupby(communication["Collective"]).median(), "ranks": g["Rank"].nunique()})
    rows = [[("", _e(kind)), ("n", _num(r["count"], 0)), ("n", _num(r["median"], 1)), ("n", _num(r["bwmed"], 1)), ("n", _num(r["bwmin"], 1)), ("n", str(int(r["ranks"])))]
            for kind, r in stats.iterrows()]
    return _table(["collective", "count per rank", "median us", "bus GB/s (median)", "bus GB/s (lowest rank)", "ranks"], rows)


def _ranks(tables: RankTables, diagnosis: Diagnosis, problems: dict[int, list[str]]) -> str:
    slow = {w.rank: w for w in diagnosis.slowWorkers}
    ratios, _ = kernel_ratios(tables)
    r = tables.ranks
    rows, classes = [], []
    for _, row in r.iterrows():
        rank = int(row["rank"])
        rows.append([("n", str(rank)), ("", _e(row["pod"])), ("", _e(row["node"])), ("n", _num(row["stepUs"] / 1000, 2)),
                     ("n", _num(float(ratios.get(rank, np.nan)), 3)), ("n", _num(slow[rank].slowdown, 2) if rank in slow else ""),
                     ("", _e("; ".join(problems.get(rank, []))))])
        classes.append("slow" if rank in slow else "")
    for rank in sorted(set(problems) - set(r["rank"])):
        rows.append([("n", str(rank)), ("", ""), ("", ""), ("n", "–"), ("n", "–"), ("n", ""), ("", _e("; ".join(problems[rank])))])
        classes.append("")
    return _table(["rank", "pod", "node", "median step ms", "kernel time vs peers", "slowdown", "problems"], rows, classes)


def render_html(*, title: str, source: str, generated: str, diagnosis: Diagnosis, full: list[dict[str, Any]], tables: RankTables,
                csv: dict[str, pd.DataFrame], problems: dict[int, list[str]], total_ranks: int,
                merged: str = "merged.trace.json.gz: the ranks' traces (open it in Perfetto).") -> str:
    top = full[0]["severity"] if full else "info"
    step = diagnosis.stepTimeMs
    b = diagnosis.breakdown
    slow = {w.rank for w in diagnosis.slowWorkers}
    ranks = tables.ranks.sort_values("rank")
    labels = [f"rank {r}" for r in ranks["rank"]]
    positions = {r: i for i, r in enumerate(ranks["rank"])}
    highlight = {positions[r] for r in slow if r in positions}
    ratios, _ = kernel_ratios(tables)
    cards = [("ranks analysed", f"{len(ranks)} / {total_ranks}"),
             ("step time (median)", f"{step.median:,.1f} ms" if step else "–"),
             ("step time (min – max)", f"{step.min:,.1f} – {step.max:,.1f} ms" if step else "–"),
             ("slow workers", ", ".join(f"rank {w.rank}" for w in diagnosis.slowWorkers) or "none")]
    if diagnosis.confidence is not None:
        cards.append(("confidence", f"{diagnosis.confidence:.2f}"))
    if b:
        cards += [("compute", f"{b.computePct:.1f}%"), ("comm. not overlapped", f"{b.commNotOverlappedPct:.1f}%"), ("idle", f"{b.idlePct:.1f}%")]
    card_html = "".join(f'<div class="card"><div class="k">{_e(k)}</div><div class="v">{_e(v)}</div></div>' for k, v in cards)
    kernel_chart = _bar_chart([f"rank {r}" for r in ratios.index], ratios.to_numpy(), {i for i, r in enumerate(ratios.index) if r in slow}, "x peers", 1.0, "peers") \
        if len(ratios) else '<p class="note">needs GPU kernels on two or more ranks</p>'
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>{_e(title)}</title><style>{_CSS}</style></head><body>
<header><h1>{_e(title)}</h1><div class="meta">{_e(source)} · generated {_e(generated)}</div></header>
<main>
<div class="summary {_e(top)}">{_e(diagnosis.summary)}</div>
<div class="cards">{card_html}</div>
<section><h2>Findings (worst first)</h2>{_findings(full)}</section>
{_hangs(full)}
{_slow_workers(full)}
<section><h2>Median step time per rank</h2>{_bar_chart(labels, ranks["stepUs"].to_numpy() / 1000.0, highlight, "ms", step.median if step else None)}
<p class="note">Slow workers in red. In a synchronous job every rank waits for the slowest, so step times even out: see kernel times and findings.</p></section>
<section><h2>Kernel time relative to the same kernels on the other ranks</h2>{kernel_chart}</section>
<section><h2>Step breakdown per rank</h2>{_stacked_chart(tables)}</section>
<section><h2>Top kernels (all ranks)</h2>{_kernels(csv["op_statistic.csv"])}</section>
<section><h2>Python functions</h2>{_functions(tables)}</section>
<section><h2>Communication</h2>{_communication(csv["communication.csv"])}</section>
<section><h2>Ranks</h2>{_ranks(tables, diagnosis, problems)}</section>
<p class="note">Tables: step_trace_time.csv, kernel_details.csv, op_statistic.csv, communication.csv; all findings: diagnosis.json.</p>
<p class="note">{_e(merged)}</p>
</main><script>{_JS}</script></body></html>
"""
