// halluscope web page: talks only to this server's /v1 API (no other network access; see the CSP header).
"use strict";

const $ = (id) => document.getElementById(id);
let artifacts = [];

const EXAMPLE = {
  question: "What is the capital of Australia?",
  answer: "The capital of Australia is Sydney, which became the capital in 1901.",
  evidence: "Canberra is the capital city of Australia. It was selected as the site of the capital in 1908.",
};

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h["X-API-Key"] = key;
  return h;
}

function setStatus(text, isError) {
  const s = $("status");
  s.textContent = text;
  s.classList.toggle("error", Boolean(isError));
}

async function api(path, body) {
  const init = body === undefined ? { headers: headers() } : { method: "POST", headers: headers(), body: JSON.stringify(body) };
  const resp = await fetch(path, init);
  let data = null;
  try { data = await resp.json(); } catch (e) { data = null; }
  if (!resp.ok) {
    const msg = (data && data.error) || `HTTP ${resp.status}`;
    const err = new Error(msg);
    err.status = resp.status;
    throw err;
  }
  return data;
}

// Evidence files of these types are read on the server (POST /v1/evidence: PDF, DOCX, text); others
// (.csv, .tsv, .json) are plain text read here, in the browser.
const SERVER_READ = [".pdf", ".docx", ".txt", ".md", ".markdown", ".text", ".rst"];

function suffix(name) {
  const i = name.lastIndexOf(".");
  return i < 0 ? "" : name.slice(i).toLowerCase();
}

function toBase64(buffer) {
  const bytes = new Uint8Array(buffer);
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    binary += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return btoa(binary);
}

async function readEvidenceFile(file) {
  if (SERVER_READ.includes(suffix(file.name))) {
    const data = await api("/v1/evidence", { filename: file.name, content_base64: toBase64(await file.arrayBuffer()) });
    return data.text;
  }
  return (await file.text()).trim();
}

function artifactLabel(a) {
  const where = a.task ? `task ${a.task}` : `lang ${a.lang}`;
  const score = a.selection_score == null ? "" : ` · cv ${a.metric} ${a.selection_score.toFixed(3)}`;
  return `${a.program} · ${where} · v${String(a.version).padStart(4, "0")}${score}`;
}

// #34: with artifacts for several languages, the default is "auto": the server identifies the answer's language
// offline and serves that language's artifact (the cross-lingual one when unsure), so an English answer is never
// checked with the first listed (German) artifact's settings
function autoProgram() {
  const counts = {};
  for (const a of artifacts) if (a.lang) counts[a.program] = (counts[a.program] || 0) + 1;
  const best = Object.entries(counts).sort((x, y) => y[1] - x[1])[0];
  return best && best[1] > 1 ? best[0] : null;
}

async function loadArtifacts() {
  try {
    const data = await api("/v1/artifacts");
    artifacts = data.artifacts;
    const sel = $("artifact");
    const options = artifacts.map((a, i) => {
      const o = document.createElement("option");
      o.value = String(i);
      o.textContent = artifactLabel(a);
      return o;
    });
    const program = autoProgram();
    if (program) {
      const o = document.createElement("option");
      o.value = "auto";
      o.textContent = `${program} · the answer's language (auto)`;
      options.unshift(o);
    }
    sel.replaceChildren(...options);
    sel.value = program ? "auto" : "0";
    describeArtifact();
    setStatus("");
  } catch (e) {
    if (e.status === 401) {
      $("key-row").open = true;
      setStatus("This server needs an API key: enter it, then press Detect.", true);
    } else {
      setStatus(`Could not list the detectors: ${e.message}`, true);
    }
  }
}

function describeArtifact() {
  if ($("artifact").value === "auto") {
    $("artifact-info").textContent = "the answer's language is identified on the server (offline); its artifact " +
      "is used, the cross-lingual one when unsure";
    return;
  }
  const a = artifacts[Number($("artifact").value)];
  $("artifact-info").textContent = a
    ? `${a.uses_lm ? "uses the language model" : "no language model"}; compiled ${a.created_at || "?"} on ${a.source || "?"}; hash ${a.content_hash.slice(0, 12)}`
    : "";
}

// Python offsets count code points; JavaScript strings count UTF-16 units: work on code point arrays.
function unitAt(units, i) {
  return units.find((u) => u.start <= i && i < u.end);
}

function alpha(p) {
  return (0.1 + 0.75 * Math.max(0, Math.min(1, p))).toFixed(3);
}

function renderHighlighted(det) {
  // what to mark comes from the server (contract.display_marks), as the CLI's text view: a unit the detector calls
  // supported is never shown as doubtful, and nothing is marked when the answer could not be verified
  const chars = Array.from(det.answer);
  const box = $("highlighted");
  box.replaceChildren();
  let pos = 0;
  const runs = (det.marks || []).slice().sort((a, b) => a.start - b.start);
  for (const run of runs) {
    if (run.start > pos) box.append(document.createTextNode(chars.slice(pos, run.start).join("")));
    const text = chars.slice(run.start, run.end).join("");
    const m = document.createElement("mark");
    m.className = "span " + (run.kind === "hallucinated" ? "hard" : "soft");
    m.textContent = text;
    m.dataset.prob = String(run.prob);
    m.dataset.start = String(run.start);
    m.dataset.end = String(run.end);
    m.style.backgroundColor = `rgba(220, 38, 38, ${alpha(run.prob)})`;
    const unit = unitAt(det.units || [], run.start);
    const unitText = unit ? ` · ${unit.kind} ${det.units.indexOf(unit) + 1}: ${unit.label}` : "";
    m.title = `p = ${run.prob.toFixed(2)}${unitText}`;
    m.tabIndex = 0;
    m.setAttribute("aria-label", `${run.kind === "hallucinated" ? "hallucinated" : "doubtful"}, probability ${run.prob.toFixed(2)}${unitText}: ${text}`);
    box.append(m);
    pos = Math.max(pos, run.end);
  }
  if (pos < chars.length) box.append(document.createTextNode(chars.slice(pos).join("")));
}

function renderUnits(units) {
  $("units-box").hidden = !units.length;
  const body = $("units").querySelector("tbody");
  body.replaceChildren(...units.map((u, i) => {
    const tr = document.createElement("tr");
    const cells = [String(i + 1), u.kind, u.text, u.label, u.score.toFixed(2)];
    cells.forEach((c, j) => {
      const td = document.createElement("td");
      td.textContent = c;
      if (j === 0 || j === 4) td.className = "num";
      tr.append(td);
    });
    if (u.rationale) tr.title = u.rationale;
    return tr;
  }));
}

// Word-level diff (longest common subsequence), small inputs only; larger ones show old and new whole.
function diffWords(a, b) {
  const x = a.split(/(\s+)/).filter((t) => t !== "");
  const y = b.split(/(\s+)/).filter((t) => t !== "");
  if (x.length * y.length > 2_000_000) return [["del", a], ["ins", b]];
  const n = x.length, m = y.length;
  const L = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1));
  for (let i = n - 1; i >= 0; i--) for (let j = m - 1; j >= 0; j--)
    L[i][j] = x[i] === y[j] ? L[i + 1][j + 1] + 1 : Math.max(L[i + 1][j], L[i][j + 1]);
  const out = [];
  const push = (kind, t) => {
    if (out.length && out[out.length - 1][0] === kind) out[out.length - 1][1] += t;
    else out.push([kind, t]);
  };
  let i = 0, j = 0;
  while (i < n && j < m) {
    if (x[i] === y[j]) { push("same", x[i]); i++; j++; }
    else if (L[i + 1][j] >= L[i][j + 1]) push("del", x[i++]);
    else push("ins", y[j++]);
  }
  while (i < n) push("del", x[i++]);
  while (j < m) push("ins", y[j++]);
  return out;
}

function renderRevision(det) {
  const has = typeof det.revision === "string" && det.revision !== "" && det.revision !== det.answer;
  $("revision-box").hidden = !has;
  if (!has) return;
  const box = $("revision");
  box.replaceChildren(...diffWords(det.answer, det.revision).map(([kind, text]) => {
    if (kind === "same") return document.createTextNode(text);
    const el = document.createElement(kind);
    el.textContent = text;
    return el;
  }));
}

function renderEvidence(evidence) {
  $("evidence-box").hidden = !evidence.length;
  $("evidence-list").replaceChildren(...evidence.map((e) => {
    const li = document.createElement("li");
    const src = document.createElement("span");
    src.className = "src";
    src.textContent = `${e.source}${e.id ? " · " + e.id : ""}${e.score ? " · score " + e.score.toFixed(3) : ""}`;
    li.append(document.createTextNode(e.text + " "), src);
    return li;
  }));
}

function render(det) {
  // the counts come from the server (contract.describe_counts): the CLI prints the same labelled line
  const failures = Object.entries(det.failures || {}).map(([k, v]) => `${k}: ${v}`).join(", ");
  const notes = Object.keys(det.notes || {}).join(", ");
  // one verdict per output (the contract settles it): hallucinated, correct, or cannot verify, with its reason
  const doubtful = (det.marks || []).filter((m) => m.kind === "possibly").length;
  const verdict = det.verdict === "hallucinated" || det.label ? "Hallucination detected"
    : det.verdict === "unverifiable" ? "Cannot verify"
    : doubtful ? `No hallucination detected; ${doubtful} doubtful part${doubtful === 1 ? "" : "s"} marked: check ${doubtful === 1 ? "it" : "them"}`
    : "No hallucination detected";
  $("summary").dataset.verdict = det.verdict || (det.label ? "hallucinated" : "correct");
  $("summary").textContent = `${verdict}: ${det.verdict_reason || ""} ` +
    `(score ${det.score.toFixed(2)}; ${det.counts_text})` +
    (notes ? `. Signals left out: ${notes}` : "") + (failures ? `. Failures: ${failures}` : "");
  renderHighlighted(det);
  $("rationale-box").hidden = !det.rationale;
  $("rationale").textContent = det.rationale || "";
  renderUnits(det.units || []);
  renderRevision(det);
  renderEvidence(det.evidence || []);
  const a = det.artifact;
  const auto = det.lang_auto
    ? ` · language ${det.lang_auto.lang || "unsure"} (auto, confidence ${det.lang_auto.confidence.toFixed(2)})` : "";
  $("provenance").textContent = `${a.program} ${a.key} ${a.metric} v${String(a.version).padStart(4, "0")} ` +
    `(hash ${a.content_hash.slice(0, 12)}), ${det.seconds.toFixed(2)} s${auto}`;
  $("result").hidden = false;
  $("result").focus();
}

async function submit(ev) {
  ev.preventDefault();
  if (!artifacts.length) await loadArtifacts();
  const auto = $("artifact").value === "auto";
  const a = auto ? { program: autoProgram() } : artifacts[Number($("artifact").value)];
  if (!a || !a.program) { setStatus("No detector is loaded.", true); return; }
  const answer = $("answer").value;
  if (!answer.trim()) { setStatus("Enter an answer to check.", true); $("answer").focus(); return; }
  const body = { answer, question: $("question").value, program: a.program };
  if (auto) body.lang = "auto";
  else { body.version = a.version; if (a.task) body.task = a.task; else body.lang = a.lang; }
  const evidence = $("evidence").value.trim();
  body.evidence = evidence ? [evidence] : [];
  $("submit").disabled = true;
  try {
    for (const file of $("evidence-files").files) {  // PDF/DOCX/text read by the server; sent as passages
      setStatus(`Reading ${file.name}…`);
      let text;
      try {
        text = await readEvidenceFile(file);
      } catch (e) {
        setStatus(`Error: evidence file ${e.message.startsWith(file.name) ? "" : file.name + ": "}${e.message}`, true);
        return;
      }
      if (text) body.evidence.push({ text, source: "file", id: file.name });
    }
    setStatus("Detecting…");
    const det = await api("/v1/detect", body);
    setStatus("Done.");
    render(det);
  } catch (e) {
    setStatus(`Error: ${e.message}`, true);
  } finally {
    $("submit").disabled = false;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("detect-form").addEventListener("submit", submit);
  $("artifact").addEventListener("change", describeArtifact);
  $("api-key").addEventListener("change", loadArtifacts);
  $("example").addEventListener("click", () => {
    $("question").value = EXAMPLE.question;
    $("answer").value = EXAMPLE.answer;
    $("evidence").value = EXAMPLE.evidence;
    $("answer").focus();
  });
  document.querySelectorAll("textarea").forEach((t) => t.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) $("detect-form").requestSubmit();
  }));
  loadArtifacts();
});
