// Small SVG line charts: a title, the latest value, one line per series
// over a fixed window of points, the y axis from 0 to the largest value.

const SVG = "http://www.w3.org/2000/svg";
const W = 320;
const H = 110;

function svgEl(tag, attrs) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  return e;
}

export class LineChart {
  // `series`: [{name, className}]; `format`: value -> text; `points`: the
  // window's length.
  constructor(parent, id, title, series, format, points) {
    this.series = series.map((s) => ({ ...s, values: [] }));
    this.format = format;
    this.points = points;
    this.root = document.createElement("section");
    this.root.className = "chart panel";
    this.root.id = id;
    const h = document.createElement("h2");
    h.textContent = title;
    this.now = document.createElement("p");
    this.now.className = "chart-now";
    this.svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img" });
    this.svg.setAttribute("aria-label", title);
    this.grid = svgEl("g", { class: "grid" });
    this.svg.appendChild(this.grid);
    for (const s of this.series) {
      s.line = svgEl("polyline", { class: "line " + s.className, fill: "none", points: "" });
      this.svg.appendChild(s.line);
    }
    this.max = document.createElement("span");
    this.max.className = "chart-max";
    const legend = document.createElement("p");
    legend.className = "legend";
    for (const s of this.series) {
      const k = document.createElement("span");
      k.className = "key " + s.className;
      k.textContent = s.name;
      legend.appendChild(k);
    }
    legend.appendChild(this.max);
    this.root.append(h, this.now, this.svg, legend);
    parent.appendChild(this.root);
  }

  // Adds one value per series (null: no value this time) and redraws.
  push(values) {
    values.forEach((v, i) => {
      const s = this.series[i];
      s.values.push(v);
      if (s.values.length > this.points) s.values.shift();
    });
    this.draw();
  }

  draw() {
    let top = 0;
    for (const s of this.series) for (const v of s.values) if (v !== null && v > top) top = v;
    const ceiling = top > 0 ? top * 1.1 : 1;
    const step = W / Math.max(1, this.points - 1);
    for (const s of this.series) {
      const pts = [];
      const offset = this.points - s.values.length;
      s.values.forEach((v, i) => {
        if (v === null) return;
        const x = (offset + i) * step;
        const y = H - 4 - (v / ceiling) * (H - 8);
        pts.push(x.toFixed(1) + "," + y.toFixed(1));
      });
      s.line.setAttribute("points", pts.join(" "));
    }
    this.grid.replaceChildren(svgEl("line", { x1: 0, x2: W, y1: H - 4, y2: H - 4 }));
    this.max.textContent = "max " + this.format(top);
    const latest = this.series.map((s) => {
      const v = s.values.length ? s.values[s.values.length - 1] : null;
      return (this.series.length > 1 ? s.name + " " : "") + (v === null ? "–" : this.format(v));
    });
    this.now.textContent = latest.join(" · ");
    this.root.dataset.latest = JSON.stringify(this.series.map((s) => (s.values.length ? s.values[s.values.length - 1] : null)));
    this.root.dataset.count = String(Math.max(...this.series.map((s) => s.values.length)));
  }
}

// Horizontal bars of ratios: [{label, ratio (0..1 or null), note}].
export function ratioBars(parent, rows) {
  const out = rows.map((r) => {
    const row = document.createElement("div");
    row.className = "bar-row";
    row.dataset.option = r.label;
    const name = document.createElement("span");
    name.className = "bar-label";
    name.textContent = r.label;
    const track = document.createElement("span");
    track.className = "bar-track";
    const fill = document.createElement("span");
    fill.className = "bar-fill";
    fill.style.width = (100 * (r.ratio || 0)).toFixed(1) + "%";
    track.appendChild(fill);
    const value = document.createElement("span");
    value.className = "bar-value";
    value.textContent = r.ratio === null ? "–" : (100 * r.ratio).toFixed(1) + "%";
    value.title = r.note;
    const note = document.createElement("span");
    note.className = "bar-note";
    note.textContent = r.note;
    row.append(name, track, value, note);
    return row;
  });
  parent.replaceChildren(...out);
}
