// The chat page at GET /: one self-contained HTML document (CSS and JS
// inline, no external assets) so the binary serves it with nothing else
// installed. It keeps the conversation in the page, posts it to
// /v1/chat/completions with stream: true and renders the SSE chunks as they
// arrive through fetch + ReadableStream, then shows the speed from "timings".
#include "server/server.h"

namespace tern::server {

std::string_view chat_page_html() {
    static constexpr std::string_view kPage = R"PAGE(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>tern chat</title>
<style>
:root { --bg:#f6f7f9; --panel:#ffffff; --text:#1d2127; --muted:#6b7280; --user:#2f6fde; --user-text:#fff;
        --bot:#eceff3; --border:#d9dde3; }
@media (prefers-color-scheme: dark) {
  :root { --bg:#15171b; --panel:#1d2026; --text:#e6e8eb; --muted:#9aa1ab; --user:#3b7bea; --user-text:#fff;
          --bot:#272b33; --border:#333843; }
}
* { box-sizing: border-box; }
html, body { height: 100%; margin: 0; }
body { background: var(--bg); color: var(--text); font: 15px/1.5 system-ui, -apple-system, "Segoe UI", sans-serif;
       display: flex; flex-direction: column; }
header { padding: 12px 20px; border-bottom: 1px solid var(--border); background: var(--panel);
         display: flex; align-items: baseline; gap: 12px; }
header h1 { font-size: 17px; margin: 0; font-weight: 600; }
header span { color: var(--muted); font-size: 13px; }
#log { flex: 1; overflow-y: auto; padding: 20px; display: flex; flex-direction: column; gap: 12px;
       max-width: 860px; width: 100%; margin: 0 auto; }
.msg { max-width: 80%; padding: 10px 14px; border-radius: 14px; white-space: pre-wrap; word-wrap: break-word; }
.user { align-self: flex-end; background: var(--user); color: var(--user-text); border-bottom-right-radius: 4px; }
.assistant { align-self: flex-start; background: var(--bot); border-bottom-left-radius: 4px; }
.error { align-self: center; color: #d9534f; font-size: 13px; }
.stats { align-self: flex-start; color: var(--muted); font-size: 12px; margin-top: -8px; }
.empty { color: var(--muted); text-align: center; margin-top: 20vh; }
form { display: flex; gap: 10px; padding: 14px 20px; border-top: 1px solid var(--border); background: var(--panel); }
form > div { display: flex; gap: 10px; max-width: 860px; width: 100%; margin: 0 auto; }
textarea { flex: 1; resize: none; height: 52px; padding: 10px 12px; border-radius: 10px; border: 1px solid var(--border);
           background: var(--bg); color: var(--text); font: inherit; }
button { padding: 0 20px; border: 0; border-radius: 10px; background: var(--user); color: #fff; font: inherit;
         font-weight: 600; cursor: pointer; }
button:disabled { opacity: .5; cursor: default; }
</style>
</head>
<body>
<header><h1>tern</h1><span id="model">chat</span></header>
<div id="log"><div class="empty" id="empty">Ask something to start the conversation.</div></div>
<form id="form"><div>
<textarea id="input" placeholder="Type a message. Enter sends, Shift+Enter adds a line." autofocus></textarea>
<button id="send" type="submit">Send</button>
</div></form>
<script>
const log = document.getElementById('log'), input = document.getElementById('input');
const send = document.getElementById('send'), form = document.getElementById('form');
const history = [];
fetch('/v1/models').then(r => r.json()).then(j => {
  if (j.data && j.data[0]) document.getElementById('model').textContent = j.data[0].id;
}).catch(() => {});
function bubble(cls, text) {
  const e = document.getElementById('empty'); if (e) e.remove();
  const d = document.createElement('div'); d.className = 'msg ' + cls; d.textContent = text;
  log.appendChild(d); log.scrollTop = log.scrollHeight; return d;
}
function note(cls, text) {
  const d = document.createElement('div'); d.className = cls; d.textContent = text;
  log.appendChild(d); log.scrollTop = log.scrollHeight;
}
async function ask(text) {
  history.push({role: 'user', content: text});
  bubble('user', text);
  const out = bubble('assistant', '');
  let answer = '', timings = null;
  const t0 = performance.now();
  try {
    const r = await fetch('/v1/chat/completions', {method: 'POST', headers: {'Content-Type': 'application/json'},
      body: JSON.stringify({messages: history, stream: true, stream_options: {include_usage: true}})});
    if (!r.ok) { const j = await r.json().catch(() => ({})); throw new Error((j.error && j.error.message) || r.statusText); }
    const reader = r.body.getReader(), dec = new TextDecoder();
    let buf = '';
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buf += dec.decode(value, {stream: true});
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const line = buf.slice(0, i).trim(); buf = buf.slice(i + 2);
        if (!line.startsWith('data:')) continue;
        const data = line.slice(5).trim();
        if (data === '[DONE]') continue;
        const j = JSON.parse(data);
        if (j.error) throw new Error(j.error.message);
        if (j.timings) timings = j.timings;
        const c = j.choices && j.choices[0];
        if (c && c.delta && c.delta.content) { answer += c.delta.content; out.textContent = answer; log.scrollTop = log.scrollHeight; }
      }
    }
    history.push({role: 'assistant', content: answer});
    const secs = (performance.now() - t0) / 1000;
    note('stats', timings ? `${timings.predicted_n} tokens, ${timings.predicted_per_second.toFixed(1)} tok/s` +
         ` (prompt ${timings.prompt_per_second.toFixed(1)} tok/s), ${secs.toFixed(1)} s`
         : `${secs.toFixed(1)} s`);
  } catch (err) {
    history.pop();
    if (!answer) out.remove();
    note('error', 'Error: ' + err.message);
  }
}
form.addEventListener('submit', async ev => {
  ev.preventDefault();
  const text = input.value.trim(); if (!text || send.disabled) return;
  input.value = ''; send.disabled = true;
  await ask(text);
  send.disabled = false; input.focus();
});
input.addEventListener('keydown', ev => {
  if (ev.key === 'Enter' && !ev.shiftKey) { ev.preventDefault(); form.requestSubmit(); }
});
</script>
</body>
</html>
)PAGE";
    return kPage;
}

}  // namespace tern::server
