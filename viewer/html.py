"""A gathered :class:`~unihub.viewer.report.Report` -> one self-contained HTML page.

Everything is inline (CSS, one small script, images as ``data:`` URIs, charts as SVG), so the file
opens anywhere without a network. Every string that comes from the dataset (names, values, metadata,
error messages) goes through :func:`html.escape`; on top of that the page's Content-Security-Policy
allows no network and no script but its own (by hash), so a hostile dataset cannot run code in it.
The script marks ``<body>`` with how many thumbnails decoded and how many script errors fired:
``data-rendered="ok"`` when every thumbnail decoded and none fired (what the browser test reads).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Sequence
from html import escape
from typing import Any

import numpy as np

from unihub.viewer.describe import codec_label, human_bytes, shape_label
from unihub.viewer.report import VALUE_CHARS, Report, SampleRow
from unihub.viewer.stats import MAX_CLASSES, FieldStats, Histogram

_SCRIPT = """(function () {
  var errors = 0;
  window.addEventListener("error", function () { errors += 1; }, true);
  window.addEventListener("load", function () {
    var thumbs = document.querySelectorAll("img.thumb"), decoded = 0;
    for (var i = 0; i < thumbs.length; i++) {
      if (thumbs[i].complete && thumbs[i].naturalWidth > 0) { decoded += 1; }
    }
    var body = document.body;
    body.setAttribute("data-thumbs", String(thumbs.length));
    body.setAttribute("data-thumbs-decoded", String(decoded));
    body.setAttribute("data-script-errors", String(errors));
    body.setAttribute("data-rendered", decoded === thumbs.length && errors === 0 ? "ok" : "failed");
  });
})();"""
_SCRIPT_HASH = base64.b64encode(hashlib.sha256(_SCRIPT.encode()).digest()).decode()
_CSP = (f"default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'sha256-{_SCRIPT_HASH}'; "
        "base-uri 'none'; form-action 'none'")

#: characters of a metadata value the page shows (a class is cut at VALUE_CHARS, as a sampled value)
TEXT_CHARS = 2000

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:20px;word-break:break-all}h2{font-size:16px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse}td,th{padding:2px 10px 2px 0;text-align:left;vertical-align:top}
th{font-weight:600}.num{text-align:right;font-variant-numeric:tabular-nums}
.grid{display:flex;flex-wrap:wrap;gap:12px}.card{border:1px solid #ddd;border-radius:6px;padding:8px;width:280px}
.card img{height:96px;max-width:128px;image-rendering:pixelated;background:#eee;margin:0 4px 4px 0}
.card dl{margin:4px 0 0;font-size:12px;display:grid;grid-template-columns:auto 1fr;gap:0 8px}
.card dt{color:#666}.card dd{margin:0;word-break:break-all}.bad{color:#a00;font-size:12px}
.field{border-top:1px solid #eee;padding:8px 0}.bar{background:#4a7fb5;height:10px;display:inline-block}
.muted{color:#777}svg rect{fill:#4a7fb5}code{word-break:break-all}
"""


def render(report: Report) -> str:
    """The page of ``report``, as text."""
    parts = [
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{_CSP}\">",
        f"<title>unihub show: {escape(report.url)}</title><style>{_CSS}</style>",
        f"<script>{_SCRIPT}</script></head><body>",
        f"<h1>{escape(report.url)}</h1>",
        _summary(report), _schema(report), _provenance(report.provenance), _sample(report), _statistics(report),
        "</body></html>\n",
    ]
    return "\n".join(parts)


def _summary(report: Report) -> str:
    info = report.description
    counts = [("rows", _int(info["rows"])), ("files", _int(info["files"])),
              ("row groups", _int(info["row_groups"])), ("bytes", _bytes(info["bytes"]))]
    if info.get("partitions"):
        counts.append(("partitions", ", ".join(info["partitions"])))
    if report.where is not None:
        counts.append(("rows matching the filter", f"{_int(report.matched)} (filter: {report.where})"))
    rows = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in counts)
    source = {"unihub": "unihub metadata", "petastorm": "Petastorm metadata (pickle, allow-listed)",
              "inferred": "inferred from the Parquet types"}.get(info["schema_source"], info["schema_source"])
    sizes = report.row_group_rows
    groups = ""
    if sizes:
        histogram = Histogram(integer=True)
        histogram.add(np.asarray(sizes))
        groups = (f"<p>Rows per row group: min {_int(min(sizes))}, max {_int(max(sizes))}</p>"
                  + _svg_histogram(histogram, "rows per row group", "row groups"))
    return (f"<section id=\"summary\"><h2>Dataset</h2><p>schema <b>{escape(str(info['schema_name']))}</b> "
            f"({escape(source)})</p><table>{rows}</table>{groups}</section>")


def _schema(report: Report) -> str:
    head = "<tr><th>field</th><th>dtype</th><th>shape</th><th>codec</th><th>nullable</th></tr>"
    body = "".join(
        f"<tr><td>{escape(f['name'])}</td><td>{escape(str(f['dtype']))}</td><td>{escape(shape_label(f['shape']))}</td>"
        f"<td>{escape('-' if f['codec'] is None else codec_label(f['codec']))}</td>"
        f"<td>{'yes' if f['nullable'] else 'no'}</td></tr>" for f in report.description["fields"])
    return f"<section id=\"schema\"><h2>Schema</h2><table>{head}{body}</table></section>"


def _provenance(extra: dict[str, Any]) -> str:
    if not extra:
        return ("<section id=\"provenance\"><h2>Provenance</h2><p class=\"muted\">No conversion metadata "
                "(<code>unihub.extra</code>): the dataset was written directly, by Petastorm or by another "
                "Parquet writer.</p></section>")
    rows = []
    for key in ("source_format", "source", "source_files"):
        if key in extra:
            rows.append(f"<tr><th>{escape(key.replace('_', ' '))}</th><td>{_text(extra[key])}</td></tr>")
    skipped = extra.get("skipped") or []
    for key, value in extra.items():
        if key not in ("source_format", "source", "source_files", "skipped", "skipped_count"):
            rows.append(f"<tr><th>{escape(str(key))}</th><td>{_text(value)}</td></tr>")
    text = f"<section id=\"provenance\"><h2>Provenance</h2><table>{''.join(rows)}</table>"
    count = extra.get("skipped_count", len(skipped))
    if count:
        listed = "".join(f"<tr><td><code>{escape(str(s.get('path', '')))}</code></td>"
                         f"<td>{escape(str(s.get('location', '')))}</td><td>{escape(str(s.get('reason', '')))}</td></tr>"
                         for s in skipped if isinstance(s, dict))
        more = f"<p class=\"muted\">and {_int(count - len(skipped))} more</p>" if count > len(skipped) else ""
        text += (f"<h3>Skipped records: {_int(count)}</h3><table class=\"skipped\"><tr><th>file</th>"
                 f"<th>where</th><th>reason</th></tr>{listed}</table>{more}")
    return text + "</section>"


def _sample(report: Report) -> str:
    how = (f"the first {report.sampling.rows}" if report.sampling.first
           else f"{report.sampling.rows} at random (seed {report.sampling.seed})")
    title = f"<section id=\"sample\"><h2>Sample: {len(report.sample)} rows, {escape(how)}</h2>"
    if not report.sample:
        return title + "<p class=\"muted\">No rows to show.</p></section>"
    if report.image_fields:
        return title + "<div class=\"grid\">" + "".join(_card(row) for row in report.sample) + "</div></section>"
    names = [name for name, _ in report.sample[0].values]
    head = "<tr><th>row</th>" + "".join(f"<th>{escape(n)}</th>" for n in names) + "</tr>"
    body = "".join(f"<tr><td class=\"num\">{row.index}</td>"
                   + "".join(f"<td>{escape(v)}</td>" for _, v in row.values) + "</tr>" for row in report.sample)
    return title + f"<table class=\"rows\">{head}{body}</table></section>"


def _card(row: SampleRow) -> str:
    images = []
    for thumb in row.thumbs:
        label = f"{thumb.field} {thumb.shape}"
        if thumb.uri is not None:
            images.append(f"<img class=\"thumb\" src=\"{thumb.uri}\" alt=\"{escape(label)}\" title=\"{escape(label)}\">")
        else:
            images.append(f"<div class=\"bad\">{escape(thumb.field)}: {escape(thumb.problem or 'no image')}</div>")
    values = "".join(f"<dt>{escape(name)}</dt><dd>{escape(value)}</dd>" for name, value in row.values)
    return f"<div class=\"card\">{''.join(images)}<dl><dt>row</dt><dd>{row.index}</dd>{values}</dl></div>"


def _statistics(report: Report) -> str:
    scope = "the rows matching the filter" if report.where is not None else "every row"
    blocks = "".join(_field_stats(s) for s in report.stats)
    return f"<section id=\"stats\"><h2>Field statistics ({escape(scope)})</h2>{blocks}</section>"


def _field_stats(s: FieldStats) -> str:
    facts = [("nulls", "unknown" if s.nulls is None else _int(s.nulls))]
    if s.nans:
        facts.append(("NaN", _int(s.nans)))
    if s.minimum is not None:
        facts += [("min", _num(s.minimum)), ("max", _num(s.maximum)), ("mean", _num(s.mean))]
    line = ", ".join(f"{k} {escape(v)}" for k, v in facts)
    parts = [f"<div class=\"field\" data-field=\"{escape(s.name)}\"><b>{escape(s.name)}</b> "
             f"<span class=\"muted\">{escape(s.kind)}</span><br>{line}"]
    if s.kind == "image":
        parts.append("<br><span class=\"muted\">images are decoded for the sampled rows only</span>")
    if s.classes is not None and not s.classes.too_many and s.classes.counts:
        parts.append(_class_bars(s.classes.counts.most_common()))
    elif s.histogram is not None:
        parts.append(_svg_histogram(s.histogram, "value" if s.kind != "tensor" else "element value", "values"))
    if s.classes is not None and s.classes.too_many:
        parts.append(f"<br><span class=\"muted\">more than {MAX_CLASSES} distinct values</span>")
    if s.lengths is not None:
        what, unit = ("encoded size (bytes)", "images") if s.kind == "image" else ("string length", "strings")
        parts.append(f"<br>{what}" + _svg_histogram(s.lengths, what, unit))
    if s.shapes:
        more = " (the most common; there are more)" if s.more_shapes else ""
        parts.append(f"<br>shapes{more}" + _class_bars([(str(k), v) for k, v in s.shapes.most_common()]))
    return "".join(parts) + "</div>"


def _class_bars(counts: Sequence[tuple[Any, int]]) -> str:
    top = max((c for _, c in counts), default=1) or 1
    rows = "".join(f"<tr><td>{_text(value, chars=VALUE_CHARS)}</td><td class=\"num\">{_int(count)}</td>"
                   f"<td><span class=\"bar\" style=\"width:{200 * count / top:.1f}px\"></span></td></tr>"
                   for value, count in counts)
    return f"<table class=\"classes\">{rows}</table>"


def _svg_histogram(histogram: Histogram, what: str, unit: str) -> str:
    bins = histogram.edges_and_counts()
    if not bins:
        return ""
    width, height = 320, 64
    top = max(c for _, _, c in bins) or 1
    step = width / len(bins)
    bars = []
    for i, (low, high, count) in enumerate(bins):
        h = max(height * count / top, 1 if count else 0)
        label = (f"{_num(low)}" if histogram.integer and high - low <= 1 else f"{_num(low)} to {_num(high)}")
        bars.append(f"<rect x=\"{i * step:.1f}\" y=\"{height - h:.1f}\" width=\"{max(step - 1, 1):.1f}\" "
                    f"height=\"{h:.1f}\"><title>{escape(what)} {escape(label)}: {_int(count)} {escape(unit)}"
                    f"</title></rect>")
    low, high = bins[0][0], bins[-1][1]
    return (f"<div><svg class=\"histogram\" width=\"{width}\" height=\"{height}\" role=\"img\">{''.join(bars)}</svg>"
            f"<br><span class=\"muted\">{escape(_num(low))} … {escape(_num(high))}</span></div>")


def _text(value: Any, limit: int = 50, chars: int = TEXT_CHARS) -> str:
    """A metadata value or a class, escaped and at most ``chars`` characters long (a value of megabytes
    would otherwise be copied into the page whole): lists show their first ``limit`` items."""
    if isinstance(value, list):
        shown = ", ".join(str(v) for v in value[:limit])
        more = f" … ({len(value) - limit:,} more)" if len(value) > limit else ""
        return escape(_cut(shown, chars) + more)
    if isinstance(value, dict):
        return f"<code>{escape(_cut(json.dumps(value, default=str), chars))}</code>"
    return escape(_cut(str(value), chars))


def _cut(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[:chars - 1] + "…"


def _int(n: int | float) -> str:
    return f"{int(n):,}"


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e15 else f"{x:.4g}"


def _bytes(n: float) -> str:
    return human_bytes(n)

