// Line charts as standalone SVG, drawn from metric series. No dependency: the
// format is text, and a chart is axes, ticks and a polyline.

export interface Series {
  name: string;
  points: Array<[number, number]>; // [step, value]
}

export interface ChartOptions {
  title: string;
  xLabel?: string;
  yLabel?: string;
  width?: number;
  height?: number;
}

const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"];

function niceTicks(lo: number, hi: number, count = 5): number[] {
  if (!(hi > lo)) { hi = lo + 1; lo = lo - 1; }
  const raw = (hi - lo) / count;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) ?? raw;
  const ticks: number[] = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) ticks.push(Number(v.toPrecision(12)));
  return ticks;
}

function fmt(v: number): string {
  if (v === 0) return "0";
  const a = Math.abs(v);
  if (a >= 1e4 || a < 1e-3) return v.toExponential(1);
  return Number(v.toPrecision(4)).toString();
}

function esc(s: string): string {
  return s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
}

/** Render one chart with one or more series sharing the axes. */
export function lineChartSvg(series: Series[], opts: ChartOptions): string {
  const W = opts.width ?? 640, H = opts.height ?? 360;
  const m = { l: 70, r: 20, t: 40, b: 50 };
  const pts = series.flatMap((s) => s.points).filter(([x, y]) => Number.isFinite(x) && Number.isFinite(y));
  if (pts.length === 0) throw new Error(`chart '${opts.title}': no finite points to plot`);
  let [x0, x1] = [Math.min(...pts.map((p) => p[0])), Math.max(...pts.map((p) => p[0]))];
  let [y0, y1] = [Math.min(...pts.map((p) => p[1])), Math.max(...pts.map((p) => p[1]))];
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  if (y1 === y0) { const d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
  const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
  const sx = (x: number) => m.l + ((x - x0) / (x1 - x0)) * (W - m.l - m.r);
  const sy = (y: number) => H - m.b - ((y - y0) / (y1 - y0)) * (H - m.t - m.b);
  const out: string[] = [];
  out.push(`<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="sans-serif" font-size="12">`);
  out.push(`<rect width="${W}" height="${H}" fill="white"/>`);
  out.push(`<text x="${W / 2}" y="22" text-anchor="middle" font-size="15">${esc(opts.title)}</text>`);
  for (const t of niceTicks(y0, y1)) {
    if (t < y0 || t > y1) continue;
    out.push(`<line x1="${m.l}" x2="${W - m.r}" y1="${sy(t)}" y2="${sy(t)}" stroke="#eee"/>`);
    out.push(`<text x="${m.l - 6}" y="${sy(t) + 4}" text-anchor="end">${fmt(t)}</text>`);
  }
  for (const t of niceTicks(x0, x1)) {
    if (t < x0 || t > x1) continue;
    out.push(`<line x1="${sx(t)}" x2="${sx(t)}" y1="${H - m.b}" y2="${H - m.b + 5}" stroke="#333"/>`);
    out.push(`<text x="${sx(t)}" y="${H - m.b + 18}" text-anchor="middle">${fmt(t)}</text>`);
  }
  out.push(`<line x1="${m.l}" x2="${W - m.r}" y1="${H - m.b}" y2="${H - m.b}" stroke="#333"/>`);
  out.push(`<line x1="${m.l}" x2="${m.l}" y1="${m.t}" y2="${H - m.b}" stroke="#333"/>`);
  if (opts.xLabel) out.push(`<text x="${(m.l + W - m.r) / 2}" y="${H - 12}" text-anchor="middle">${esc(opts.xLabel)}</text>`);
  if (opts.yLabel) out.push(`<text transform="translate(16 ${(m.t + H - m.b) / 2}) rotate(-90)" text-anchor="middle">${esc(opts.yLabel)}</text>`);
  series.forEach((s, i) => {
    const c = COLORS[i % COLORS.length]!;
    const good = s.points.filter(([x, y]) => Number.isFinite(x) && Number.isFinite(y));
    if (good.length === 0) return;
    const d = good.map(([x, y]) => `${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join(" ");
    out.push(`<polyline fill="none" stroke="${c}" stroke-width="2" points="${d}"/>`);
    if (good.length <= 60) for (const [x, y] of good) out.push(`<circle cx="${sx(x).toFixed(1)}" cy="${sy(y).toFixed(1)}" r="2.5" fill="${c}"/>`);
    if (series.length > 1) {
      out.push(`<rect x="${m.l + 10}" y="${m.t + 4 + i * 16}" width="12" height="3" fill="${c}"/>`);
      out.push(`<text x="${m.l + 28}" y="${m.t + 9 + i * 16}">${esc(s.name)}</text>`);
    }
  });
  out.push(`</svg>`);
  return out.join("\n");
}

/** Read a metrics JSONL file ({step, data} per line, as the file logger writes) into series by key. */
export function seriesFromJsonl(text: string, source = "metrics"): Map<string, Array<[number, number]>> {
  const byKey = new Map<string, Array<[number, number]>>();
  text.split("\n").forEach((line, i) => {
    if (!line.trim()) return;
    let rec: unknown;
    try { rec = JSON.parse(line); } catch { throw new Error(`${source}:${i + 1}: not valid JSON`); }
    const r = rec as { step?: unknown; data?: unknown };
    if (typeof r.step !== "number" || typeof r.data !== "object" || r.data === null) {
      throw new Error(`${source}:${i + 1}: expected {"step": number, "data": {...}}`);
    }
    for (const [k, v] of Object.entries(r.data as Record<string, unknown>)) {
      if (typeof v !== "number" || !Number.isFinite(v)) continue;
      let arr = byKey.get(k);
      if (!arr) byKey.set(k, (arr = []));
      arr.push([r.step, v]);
    }
  });
  return byKey;
}
