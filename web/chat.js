// The chat page of `ember serve` (served from the binary; see docs/serve.md). Conversations and
// settings live in this browser's localStorage; answers stream from /v1/chat/completions, the same
// OpenAI endpoint any client uses, with the API key (when the server has one) sent as a bearer
// token. Nothing is loaded from anywhere but the server itself.
import { renderMarkdown } from './markdown.js';

const $ = (id) => document.getElementById(id);
const KEYS = { conversations: 'ember.conversations', current: 'ember.current', settings: 'ember.settings' };
const DEFAULT_SETTINGS = { system: '', temperature: 0.8, topP: 1, maxTokens: 512, apiKey: '' };

function load(key, fallback) {
  try {
    const value = JSON.parse(localStorage.getItem(key));
    return value ?? fallback;
  } catch {
    return fallback;
  }
}

let conversations = load(KEYS.conversations, []); // [{id, title, messages: [{role, content, ...}]}], newest first
let currentId = load(KEYS.current, null);
const settings = { ...DEFAULT_SETTINGS, ...load(KEYS.settings, {}) };
let modelId = 'default';
let controller = null; // the AbortController of the answer being streamed

function save() {
  localStorage.setItem(KEYS.conversations, JSON.stringify(conversations));
  localStorage.setItem(KEYS.current, JSON.stringify(currentId));
  localStorage.setItem(KEYS.settings, JSON.stringify(settings));
}

const current = () => conversations.find((c) => c.id === currentId);

function newConversation() {
  const conversation = { id: `${Date.now()}-${Math.random().toString(36).slice(2, 8)}`, title: 'New conversation', messages: [] };
  conversations.unshift(conversation);
  currentId = conversation.id;
  save();
  render();
  $('input').focus();
  return conversation;
}

function element(tag, className, text) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined) e.textContent = text;
  return e;
}

function renderList() {
  const list = $('conversations');
  list.replaceChildren();
  for (const c of conversations) {
    const row = element('div', `conversation${c.id === currentId ? ' current' : ''}`);
    const open = element('button', 'open', c.title);
    open.title = c.title;
    open.addEventListener('click', () => { if (!controller) { currentId = c.id; save(); render(); } });
    const remove = element('button', 'delete', '×');
    remove.title = 'Delete this conversation';
    remove.setAttribute('aria-label', `Delete ${c.title}`);
    remove.addEventListener('click', () => {
      if (controller && c.id === currentId) return;
      conversations = conversations.filter((x) => x !== c);
      if (currentId === c.id) currentId = conversations[0]?.id ?? null;
      save();
      render();
    });
    row.append(open, remove);
    list.append(row);
  }
}

function statsLine(m) {
  if (m.pending) return 'generating…';
  const parts = [];
  const t = m.timings, u = m.usage;
  const generated = u?.completion_tokens ?? t?.generated_tokens;
  if (generated !== undefined) parts.push(`${generated} tokens`);
  const rate = t?.decode_tokens_per_second ?? m.clientRate;
  if (rate) parts.push(`${rate.toFixed(1)} tok/s`);
  const prompt = u?.prompt_tokens ?? t?.prompt_tokens;
  const cached = u?.prompt_tokens_details?.cached_tokens ?? t?.cached_tokens;
  if (prompt !== undefined) parts.push(`prompt ${prompt} tokens, ${cached ?? 0} cached`);
  if (m.firstTokenMs !== undefined) parts.push(`first token ${Math.round(m.firstTokenMs)} ms`);
  if (m.stopped) parts.push('stopped');
  return parts.join(' · ');
}

function renderMessage(m, node) {
  node.replaceChildren(element('div', 'role', m.role === 'user' ? 'You' : 'Assistant'));
  const content = element('div', 'content');
  if (m.role === 'user') content.textContent = m.content; // what the user typed, as typed
  else content.innerHTML = renderMarkdown(m.content); // escaped first, see markdown.js
  node.append(content);
  if (m.error) node.append(element('div', 'error', `Error: ${m.error}`));
  if (m.role === 'assistant' && !m.error) node.append(element('div', 'stats', statsLine(m)));
}

function renderMessages() {
  const box = $('messages');
  box.replaceChildren();
  for (const m of current()?.messages ?? []) {
    const node = element('div', `message ${m.role}`);
    renderMessage(m, node);
    box.append(node);
  }
  box.scrollTop = box.scrollHeight;
}

function render() {
  renderList();
  renderMessages();
}

function headers() {
  const h = { 'Content-Type': 'application/json' };
  if (settings.apiKey) h.Authorization = `Bearer ${settings.apiKey}`;
  return h;
}

// The message of an error response in OpenAI's format, else its status and text.
async function errorMessage(response) {
  const text = await response.text();
  if (response.status === 401) {
    $('key-needed').hidden = false;
    $('settings').open = true;
  }
  try {
    return JSON.parse(text).error.message;
  } catch {
    return `HTTP ${response.status}: ${text.slice(0, 300)}`;
  }
}

function setBusy(busy) {
  $('send').disabled = busy;
  $('stop').disabled = !busy;
}

async function send() {
  const text = $('input').value;
  if (!text.trim() || controller) return;
  const conversation = current() ?? newConversation();
  if (!conversation.messages.length) conversation.title = text.trim().slice(0, 48);
  conversation.messages.push({ role: 'user', content: text });
  const answer = { role: 'assistant', content: '', pending: true };
  conversation.messages.push(answer);
  $('input').value = '';
  save();
  render();
  const node = $('messages').lastElementChild;
  controller = new AbortController();
  setBusy(true);
  const started = performance.now();
  let firstAt = null, pieces = 0, scheduled = false;
  const redraw = () => {
    if (scheduled) return;
    scheduled = true;
    requestAnimationFrame(() => { scheduled = false; renderMessage(answer, node); $('messages').scrollTop = 1e9; });
  };
  try {
    const messages = settings.system.trim() ? [{ role: 'system', content: settings.system }] : [];
    for (const m of conversation.messages)
      if (m !== answer && !(m.role === 'assistant' && m.error && !m.content)) messages.push({ role: m.role, content: m.content });
    const body = {
      model: modelId, messages, stream: true, stream_options: { include_usage: true },
      temperature: Number(settings.temperature), top_p: Number(settings.topP), max_tokens: Number(settings.maxTokens),
    };
    const response = await fetch('/v1/chat/completions',
      { method: 'POST', headers: headers(), body: JSON.stringify(body), signal: controller.signal });
    if (!response.ok) throw new Error(await errorMessage(response));
    const reader = response.body.getReader(), decoder = new TextDecoder();
    let buffer = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf('\n')) >= 0) {
        const line = buffer.slice(0, end).replace(/\r$/, '');
        buffer = buffer.slice(end + 1);
        if (!line.startsWith('data:')) continue;
        const data = line.slice(5).trim();
        if (data === '[DONE]') continue;
        const event = JSON.parse(data);
        if (event.error) throw new Error(event.error.message ?? 'the server reported an error');
        const choice = event.choices?.[0];
        if (choice?.delta?.content) {
          if (firstAt === null) firstAt = performance.now();
          answer.content += choice.delta.content;
          pieces++;
          redraw();
        }
        if (choice?.timings) answer.timings = choice.timings;
        if (event.timings) answer.timings = event.timings;
        if (event.usage) answer.usage = event.usage;
      }
    }
  } catch (e) {
    if (e.name === 'AbortError') answer.stopped = true;
    else answer.error = e.message;
  } finally {
    const ended = performance.now();
    if (firstAt !== null) {
      answer.firstTokenMs = firstAt - started;
      if (pieces > 1 && ended > firstAt) answer.clientRate = (pieces - 1) / ((ended - firstAt) / 1e3);
    }
    delete answer.pending;
    controller = null;
    setBusy(false);
    save();
    renderMessage(answer, node);
    $('input').focus();
  }
}

function stop() {
  if (controller) controller.abort();
}

function bindSettings() {
  const fields = [['system', 'system'], ['temperature', 'temperature'], ['top-p', 'topP'], ['max-tokens', 'maxTokens'],
    ['api-key', 'apiKey']];
  for (const [id, key] of fields) {
    $(id).value = settings[key];
    $(id).addEventListener('input', () => {
      settings[key] = $(id).value;
      if (key === 'apiKey') $('key-needed').hidden = true;
      save();
      if (key === 'apiKey') loadModel();
    });
  }
}

// The served model's id, and whether this server wants a key we do not have.
async function loadModel() {
  try {
    const response = await fetch('/v1/models', { headers: headers() });
    if (response.status === 401) {
      $('key-needed').hidden = false;
      $('settings').open = true;
      $('model').textContent = 'API key needed';
      return;
    }
    const list = await response.json();
    modelId = list.data?.[0]?.id ?? modelId;
    $('model').textContent = `model: ${modelId}`;
  } catch (e) {
    $('model').textContent = `server unreachable: ${e.message}`;
  }
}

$('composer').addEventListener('submit', (e) => { e.preventDefault(); send(); });
$('stop').addEventListener('click', stop);
$('new-conversation').addEventListener('click', () => { if (!controller) newConversation(); });
$('input').addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
});
document.addEventListener('keydown', (e) => {
  if (e.key === 'Escape') stop();
  if (e.altKey && (e.key === 'n' || e.key === 'N') && !controller) { e.preventDefault(); newConversation(); }
});
// an answer cut short by a reload was streaming: it keeps what came and says so
for (const c of conversations) for (const m of c.messages) if (m.pending) { delete m.pending; m.stopped = true; }
if (!current()) currentId = conversations[0]?.id ?? null;
bindSettings();
render();
loadModel();
