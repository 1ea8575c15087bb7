// The chat page of `llm-onnx serve`: a conversation streamed from the server's own
// POST /v1/chat/completions. No framework, no build step, nothing from another host.
// Model output is rendered by render.js, which only ever creates elements and text nodes.

import {Attachments, messageContent, thumbnail} from "./images.js";
import {asJson, codeBlock, el, jsonBlock, renderMarkdown, toolCallCard} from "./render.js";

const $ = (id) => document.getElementById(id);
const KEY = "llm-onnx-api-key";  // sessionStorage: this tab only, gone when it closes
const state = {model: null, history: [], controller: null, pendingCalls: [], keyPrompt: null,
  conversation: 0, attachments: new Attachments($("attachments"), settingsError)};

// ------------------------------------------------------------------ requests and the API key

function authorization(headers = {}) {
  const key = sessionStorage.getItem(KEY);
  return key ? {...headers, Authorization: `Bearer ${key}`} : {...headers};
}

// fetch() with the key; a 401 asks for a key (again) and retries.
async function api(path, init = {}) {
  for (;;) {
    const response = await fetch(path, {...init, headers: authorization(init.headers)});
    if (response.status !== 401) return response;
    const refused = sessionStorage.getItem(KEY) !== null;
    await askKey(refused ? `The server refused that key (${await errorText(response)}).` : "");
  }
}

function askKey(message) {
  if (state.keyPrompt) return state.keyPrompt;
  const dialog = $("key-dialog");
  $("key-error").textContent = message;
  $("key-error").hidden = !message;
  $("key").value = "";
  state.keyPrompt = new Promise((resolve) => {
    const form = $("key-form");
    form.onsubmit = (event) => {
      event.preventDefault();
      const key = $("key").value.trim();
      if (!key) return;
      sessionStorage.setItem(KEY, key);
      dialog.close();
      state.keyPrompt = null;
      resolve();
    };
  });
  dialog.showModal();
  $("key").focus();
  return state.keyPrompt;
}

async function errorText(response) {
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) return body.error.message;
  } catch {
    // not JSON: the status says it
  }
  return `HTTP ${response.status} ${response.statusText}`.trim();
}

// ------------------------------------------------------------------ the model card

async function loadModel() {
  let response;
  try {
    response = await api("v1/models");
  } catch (e) {
    $("model-name").textContent = `cannot reach the server (${e.message})`;
    return;
  }
  if (!response.ok) {
    $("model-name").textContent = await errorText(response);
    return;
  }
  const card = (await response.json()).data[0];
  state.model = card;
  $("model-name").textContent = card.id;
  const where = [card.precision, card.runs_on && `on ${card.runs_on}`,
    card.served_by && `· ${card.served_by}`];
  $("model-where").textContent = where.filter(Boolean).join(" ");
  const replica = response.headers.get("x-llm-onnx-replica");
  if (replica) $("model-where").title = `answered by ${replica}; context ${card.max_model_len} tokens`;
  document.title = `${card.id} · llm-onnx`;
  $("attach").hidden = !(card.modalities || []).includes("image");  // a folder that takes images
  if (!card.tool_call_format) {
    $("tools-box").querySelector("summary").textContent = "Tools (this chat template renders none)";
  }
}

// ------------------------------------------------------------------ settings

function requestOptions() {
  const options = {};
  const temperature = $("temperature").value.trim();
  if (temperature) options.temperature = Number(temperature);
  const maxTokens = $("max-tokens").value.trim();
  if (maxTokens) options.max_tokens = parseInt(maxTokens, 10);
  const format = $("format").value;
  if (format === "json_object") options.response_format = {type: "json_object"};
  if (format === "json_schema") {
    const schema = parseJson("JSON schema", $("schema").value);
    if (schema === null || typeof schema !== "object" || Array.isArray(schema)) {
      throw new Error("JSON schema: expected a JSON object.");
    }
    options.response_format = {type: "json_schema", json_schema: {name: "answer", schema}};
  }
  const tools = $("tools").value.trim();
  if (tools) {
    const parsed = parseJson("Tools", tools);
    if (!Array.isArray(parsed)) throw new Error("Tools: expected a JSON list of tools.");
    if (parsed.length) {
      options.tools = parsed;
      options.tool_choice = $("tool-choice").value;
      if (!$("parallel").checked) options.parallel_tool_calls = false;
    }
  }
  return options;
}

function parseJson(what, text) {
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new Error(`${what}: not JSON (${e.message}).`);
  }
}

function settingsError(message) {
  $("settings-error").textContent = message;
  $("settings-error").hidden = !message;
}

// ------------------------------------------------------------------ the conversation

function scrollDown() {
  const box = $("messages");
  box.scrollTop = box.scrollHeight;
}

function userView(text, images) {
  const view = el("article", "msg user");
  view.append(el("div", "role", "You"));
  if (images.length) {
    const row = el("div", "images");
    row.append(...images.map(thumbnail));
    view.append(row);
  }
  if (text.trim() || !images.length) view.append(el("div", "text", text));
  $("messages").append(view);
  scrollDown();
  return view;
}

// The view of one answer: thinking (folded), the text, tool calls, and a line of numbers.
class AnswerView {
  constructor(name, json) {
    this.json = json;
    this.node = el("article", "msg assistant");
    this.node.dataset.state = "streaming";
    this.reasoning = el("details", "reasoning");
    this.reasoning.hidden = true;
    this.summary = el("summary", null, "Thinking…");
    this.thoughts = el("div", "reasoning-text");
    this.reasoning.append(this.summary, this.thoughts);
    this.content = el("div", "content");
    this.raw = el("pre", "raw");
    this.raw.hidden = true;
    this.calls = el("div", "tool-calls");
    this.stats = el("div", "stats");
    this.numbers = el("span", "numbers", "waiting for the first token…");
    this.toggle = el("button", "raw-toggle", "raw");
    this.toggle.type = "button";
    this.toggle.title = "Show the text exactly as the model wrote it";
    this.toggle.addEventListener("click", () => this.flip());
    this.stats.append(this.numbers, this.toggle);
    this.node.append(el("div", "role", name), this.reasoning, this.content, this.raw, this.calls,
      this.stats);
    this.frame = 0;
    $("messages").append(this.node);
    scrollDown();
  }

  flip() {
    const showRaw = this.raw.hidden;
    this.raw.hidden = !showRaw;
    this.content.hidden = showRaw;
    this.toggle.textContent = showRaw ? "rendered" : "raw";
  }

  update(reply) {
    if (!this.frame) this.frame = requestAnimationFrame(() => this.render(reply, false));
  }

  render(reply, final) {
    cancelAnimationFrame(this.frame);
    this.frame = 0;
    if (reply.reasoning) {
      this.reasoning.hidden = false;
      this.thoughts.textContent = reply.reasoning;
      if (final || reply.content || reply.calls.length) {
        const seconds = ((reply.thoughtEnd ?? reply.last) - reply.first) / 1000;
        this.summary.textContent = `Thought for ${Math.max(seconds, 0).toFixed(1)} s`;
      }
    }
    const value = final ? asJson(reply.content) : undefined;
    if (value !== undefined && typeof value === "object" && value !== null) {
      this.content.replaceChildren(jsonBlock(value, this.json ? "JSON answer" : "JSON"));
    } else if (this.json) {
      this.content.replaceChildren(codeBlock(reply.content, "json"));
    } else {
      this.content.replaceChildren(renderMarkdown(reply.content));
    }
    this.raw.textContent = reply.content;
    this.calls.replaceChildren(...reply.calls.map(toolCallCard));
    scrollDown();
  }

  finish(reply, how, error) {
    this.render(reply, true);
    this.node.dataset.state = how;
    const parts = [];
    if (reply.first !== null) {
      const tokens = reply.usage ? reply.usage.completion_tokens : reply.chunks;
      parts.push(`${reply.usage ? "" : "~"}${tokens} token${tokens === 1 ? "" : "s"}`);
      // The rate after the first token (the prompt's time is the first token's): measurable
      // once the tokens came over more than a few milliseconds, not all in one read.
      const spread = reply.last - reply.first;
      if (tokens > 1 && spread >= 10) {
        parts.push(`${(((tokens - 1) * 1000) / spread).toFixed(1)} tok/s`);
      } else if (tokens > 1) {
        parts.push(`all in ${Math.round(reply.last - reply.start)} ms`);
      }
      parts.push(`first token ${Math.round(reply.first - reply.start)} ms`);
    }
    if (how === "stopped") parts.push("stopped");
    if (reply.finish === "length") parts.push("cut at max tokens");
    this.numbers.textContent = parts.join(" · ");
    if (error) this.node.append(el("p", "error", error));
  }

  // Inputs for the results of the calls that ended this answer (sent with the next message).
  askResults(reply) {
    return Array.from(this.calls.children, (card, i) => {
      const input = el("input", "tool-result");
      input.placeholder = `result of ${reply.calls[i].function.name} (sent with your next message)`;
      card.append(input);
      return {call: reply.calls[i], input};
    });
  }
}

function applyChunk(reply, chunk, now) {
  if (chunk.error) throw new Error(chunk.error.message || "the server reported an error");
  if (chunk.usage) reply.usage = chunk.usage;
  const choice = chunk.choices && chunk.choices[0];
  if (!choice) return;
  const delta = choice.delta || {};
  let got = false;
  if (delta.reasoning_content) {
    reply.reasoning += delta.reasoning_content;
    got = true;
  }
  if (delta.content) {
    if (reply.reasoning && reply.thoughtEnd === null) reply.thoughtEnd = now;
    reply.content += delta.content;
    got = true;
  }
  for (const part of delta.tool_calls || []) {
    const call = reply.calls[part.index] ??
      (reply.calls[part.index] = {id: "", type: "function", function: {name: "", arguments: ""}});
    if (part.id) call.id = part.id;
    if (part.function && part.function.name) call.function.name += part.function.name;
    if (part.function && part.function.arguments) call.function.arguments += part.function.arguments;
    got = true;
  }
  if (got) {
    reply.chunks += 1;
    if (reply.first === null) reply.first = now;
    reply.last = now;
  }
  if (choice.finish_reason) reply.finish = choice.finish_reason;
}

// Server-sent events: "data: {...}" blocks separated by blank lines, ending with [DONE].
async function readEvents(response, onChunk) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, {stream: true});
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event.split("\n").filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).trimStart()).join("\n");
      if (data === "[DONE]") return;
      if (data) onChunk(JSON.parse(data));
    }
  }
}

async function ask(messages, options, view) {
  const controller = new AbortController();
  state.controller = controller;
  busy(true);
  const reply = {content: "", reasoning: "", calls: [], usage: null, finish: null, chunks: 0,
    start: performance.now(), first: null, last: null, thoughtEnd: null};
  const body = {model: state.model ? state.model.id : undefined, messages, stream: true,
    stream_options: {include_usage: true}, ...options};
  try {
    const response = await api("v1/chat/completions", {
      method: "POST", headers: {"Content-Type": "application/json"},
      body: JSON.stringify(body), signal: controller.signal});
    if (!response.ok) throw new Error(await errorText(response));
    await readEvents(response, (chunk) => {
      applyChunk(reply, chunk, performance.now());
      view.update(reply);
    });
    view.finish(reply, "done");
    return {reply, ok: true};
  } catch (e) {
    if (e.name === "AbortError") {
      view.finish(reply, "stopped");
      return {reply, ok: true};
    }
    view.finish(reply, "error", e.message);
    return {reply, ok: false};
  } finally {
    state.controller = null;
    busy(false);
  }
}

function busy(on) {
  $("send").hidden = on;
  $("stop").hidden = !on;
  $("messages").setAttribute("aria-busy", on ? "true" : "false");
}

async function send(event) {
  event.preventDefault();
  if (state.controller) return;
  const text = $("prompt").value;
  const results = state.pendingCalls.map(({call, input}) =>
    ({role: "tool", tool_call_id: call.id, content: input.value}));
  if (!text.trim() && !results.length && !state.attachments.items.length) return;
  let options;
  try {
    options = requestOptions();
  } catch (e) {
    settingsError(e.message);
    return;
  }
  settingsError("");
  for (const {input} of state.pendingCalls) input.disabled = true;
  state.pendingCalls = [];
  const added = [...results];
  const images = state.attachments.take();
  if (text.trim() || images.length) {
    added.push({role: "user", content: messageContent(text, images)});
    userView(text, images);
  }
  $("prompt").value = "";
  const system = $("system").value.trim();
  const messages = [...(system ? [{role: "system", content: system}] : []), ...state.history,
    ...added];
  const view = new AnswerView(state.model ? state.model.id : "model", !!options.response_format);
  const conversation = state.conversation;
  const {reply, ok} = await ask(messages, options, view);
  if (conversation !== state.conversation) return;  // "New conversation" while it streamed
  if (!ok) {
    if (!$("prompt").value) $("prompt").value = text;
    state.attachments.restore(images);
    return;
  }
  const message = {role: "assistant", content: reply.content};
  if (reply.calls.length) {
    message.tool_calls = reply.calls;
    if (!reply.content) message.content = null;
    state.pendingCalls = view.askResults(reply);
  }
  state.history.push(...added, message);
}

function newConversation() {
  if (state.controller) state.controller.abort();
  state.conversation += 1;
  state.history = [];
  state.pendingCalls = [];
  state.attachments.clear();
  $("messages").replaceChildren();
  $("prompt").focus();
}

// ------------------------------------------------------------------ wiring

$("composer").addEventListener("submit", send);
$("prompt").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    $("composer").requestSubmit();
  }
});
$("prompt").addEventListener("paste", (event) => {
  if (!$("attach").hidden) state.attachments.paste(event);
});
$("image-file").addEventListener("change", (event) => {
  state.attachments.add(Array.from(event.target.files));
  event.target.value = "";
});
$("stop").addEventListener("click", () => state.controller && state.controller.abort());
$("new-chat").addEventListener("click", newConversation);
$("format").addEventListener("change", () => {
  $("schema-box").hidden = $("format").value !== "json_schema";
});
$("key-dialog").addEventListener("cancel", (event) => event.preventDefault());
loadModel();
