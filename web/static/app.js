// hypercodec inspector: reads a .hwz lazily with Blob.slice and renders what the WebAssembly
// Inspector (web/src/lib.rs) reports. A classic script, so the page also works from file://.
"use strict";

const $ = (id) => document.getElementById(id);
let inspector = null;
let currentFile = null;
let rows = [];
let sortKey = null;
let sortDir = 1;

const ready = (async () => {
  const bin = atob(HWZ_WASM_B64);
  const bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  await wasm_bindgen({ module_or_path: bytes });
})();

function fmtBytes(n) {
  if (n < 1024) return n + " B";
  const u = ["KiB", "MiB", "GiB", "TiB"];
  let i = -1;
  do { n /= 1024; i++; } while (n >= 1024 && i < u.length - 1);
  return n.toFixed(2) + " " + u[i];
}

function fmt(v, digits) {
  return v === null || v === undefined ? "—" : Number(v).toFixed(digits);
}

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = false;
}

async function read(file, start, end) {
  return new Uint8Array(await file.slice(start, end).arrayBuffer());
}

async function openFile(file) {
  await ready;
  $("error").hidden = true;
  $("overview").hidden = true;
  $("hist-section").hidden = true;
  $("status").textContent = "reading " + file.name + " …";
  const t0 = performance.now();
  try {
    const size = file.size;
    const head = await read(file, 0, Math.min(wasm_bindgen.head_len(), size));
    let next, readBytes;
    if (head[0] === 0x50 && head[1] === 0x4b && head[2] === 0x03 && head[3] === 0x04) {
      // A legacy zip-based archive (Hyper Glyph): small, read whole.
      next = wasm_bindgen.Inspector.legacy(await read(file, 0, size));
      readBytes = size;
    } else {
      const tail = await read(file, Math.max(0, size - wasm_bindgen.tail_len()), size);
      next = new wasm_bindgen.Inspector(head, tail, size);
      const [off, len] = next.manifestRange();
      next.loadManifest(await read(file, off, off + len));
      readBytes = head.length + tail.length + len;
    }
    const summary = JSON.parse(next.summary());
    if (inspector) inspector.free();
    inspector = next;
    currentFile = file;
    render(file.name, summary);
    const ms = performance.now() - t0;
    $("status").textContent = `table ready in ${ms.toFixed(0)} ms (read ${fmtBytes(readBytes)} of ${fmtBytes(size)})`;
    $("status").dataset.ms = ms.toFixed(1);
  } catch (e) {
    $("status").textContent = "";
    showError(`${file.name}: ${e.message || e}`);
  }
}

function render(name, s) {
  $("file-name").textContent = name;
  const totals = [
    ["format", `hwz v${s.version} (${s.generator || "unknown writer"})`],
    ["tensors", s.tensors.length],
    ["values", s.elements.toLocaleString()],
    ["file", fmtBytes(s.file_bytes)],
    ["payload", fmtBytes(s.payload_bytes)],
    ["manifest", fmtBytes(s.manifest_bytes)],
    ["bits per value, all-in", fmt(s.bps_all_in, 3)],
    ["lossy tensors (quality figures count only these)", [s.lossy
      ? `${s.lossy.tensors} tensors, ${s.lossy.elements.toLocaleString()} values at ${fmt(s.lossy.bps, 3)} bps (${fmt(s.lossy.all_in_bps, 3)} all-in); SNR ${fmt(s.lossy.snr_db, 2)} dB (per tensor min ${fmt(s.lossy.min_snr_db, 2)}, median ${fmt(s.lossy.median_snr_db, 2)})`
      : "", s.lossy_without_snr
      ? `${s.lossy_without_snr} more without a finite SNR (non-finite values)`
      : ""].filter(Boolean).join("; ") || "none: every tensor exact"],
    ["metadata", s.metadata_keys.join(", ") || "—"],
  ];
  $("totals").replaceChildren(...totals.flatMap(([k, v]) => {
    const dt = document.createElement("dt"); dt.textContent = k;
    const dd = document.createElement("dd"); dd.textContent = v;
    return [dt, dd];
  }));
  const roles = Object.entries(s.roles).sort((a, b) => b[1] - a[1]);
  const max = Math.max(1, ...roles.map(([, v]) => v));
  $("roles").replaceChildren(...roles.map(([role, bytes]) => {
    const bar = document.createElement("div"); bar.className = "bar"; bar.dataset.role = role; bar.dataset.bytes = bytes;
    const label = document.createElement("span"); label.className = "label"; label.textContent = role;
    const fill = document.createElement("span"); fill.className = "fill"; fill.style.width = (100 * bytes / max).toFixed(1) * 5 + "px";
    const text = document.createElement("span");
    text.textContent = `${fmtBytes(bytes)} (${(100 * bytes / Math.max(1, s.payload_bytes)).toFixed(1)} %)`;
    bar.append(label, fill, text);
    return bar;
  }));
  rows = s.tensors.map((t) => ({ ...t, shape: t.shape.join("×") }));
  sortKey = null;
  document.querySelectorAll("th").forEach((th) => th.classList.remove("asc", "desc"));
  renderRows();
  $("overview").hidden = false;
}

function renderRows() {
  const body = $("tensors").tBodies[0];
  body.replaceChildren(...rows.map((t) => {
    const tr = document.createElement("tr");
    tr.dataset.name = t.name;
    const cells = [
      [t.name, ""], [t.shape, ""], [t.encoding, ""], [fmt(t.bps, 3), "num"],
      [fmt(t.ratio_vs_f32, 2), "num"], [fmt(t.snr_db, 2), "num"], [t.stored_bytes.toLocaleString(), "num"],
    ];
    for (const [text, cls] of cells) {
      const td = document.createElement("td"); td.textContent = text; if (cls) td.className = cls; tr.append(td);
    }
    tr.addEventListener("click", () => showHistogram(t.name, tr));
    return tr;
  }));
}

function sortBy(key) {
  sortDir = sortKey === key ? -sortDir : 1;
  sortKey = key;
  rows.sort((a, b) => {
    const x = a[key], y = b[key];
    if (x === y) return 0;
    if (x === null || x === undefined) return 1;
    if (y === null || y === undefined) return -1;
    return (typeof x === "number" ? x - y : String(x).localeCompare(String(y))) * sortDir;
  });
  document.querySelectorAll("th").forEach((th) => {
    th.classList.toggle("asc", th.dataset.key === key && sortDir === 1);
    th.classList.toggle("desc", th.dataset.key === key && sortDir === -1);
  });
  renderRows();
}

async function showHistogram(name, tr) {
  document.querySelectorAll("tbody tr.selected").forEach((r) => r.classList.remove("selected"));
  tr.classList.add("selected");
  try {
    const [start, end] = inspector.tensorRange(name);
    const bytes = await read(currentFile, start, end);
    const h = JSON.parse(inspector.histogram(name, start, bytes, 64));
    drawHistogram(name, h);
  } catch (e) {
    showError(`${name}: ${e.message || e}`);
  }
}

function drawHistogram(name, h) {
  $("hist-name").textContent = name;
  const canvas = $("histogram");
  const ctx = canvas.getContext("2d");
  const W = canvas.width, H = canvas.height, pad = 24;
  ctx.clearRect(0, 0, W, H);
  const max = Math.max(1, ...h.counts);
  const bw = (W - 2 * pad) / h.counts.length;
  ctx.fillStyle = "#2f7fc1";
  h.counts.forEach((c, i) => {
    const bh = (H - 2 * pad) * c / max;
    ctx.fillRect(pad + i * bw + 0.5, H - pad - bh, Math.max(1, bw - 1), bh);
  });
  ctx.fillStyle = "#4d5b69";
  ctx.font = "12px system-ui";
  ctx.fillText(fmt(h.min, 4), pad, H - 6);
  const right = fmt(h.max, 4);
  ctx.fillText(right, W - pad - ctx.measureText(right).width, H - 6);
  canvas.dataset.tensor = name;
  canvas.dataset.count = h.count;
  canvas.dataset.bins = h.counts.length;
  $("hist-info").textContent =
    `${h.count.toLocaleString()} values, min ${fmt(h.min, 5)}, max ${fmt(h.max, 5)}, mean ${fmt(h.mean, 5)}, std ${fmt(h.std, 5)}` +
    (h.non_finite ? `, ${h.non_finite} non-finite` : "");
  $("hist-section").hidden = false;
}

$("file").addEventListener("change", (e) => { if (e.target.files[0]) openFile(e.target.files[0]); });
const drop = $("drop");
drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", (e) => {
  e.preventDefault();
  drop.classList.remove("over");
  if (e.dataTransfer.files[0]) openFile(e.dataTransfer.files[0]);
});
document.querySelectorAll("th").forEach((th) => th.addEventListener("click", () => sortBy(th.dataset.key)));
