// Model text -> DOM nodes. Model output is untrusted: every node is made with createElement or
// createTextNode and filled with textContent; no string is ever parsed as HTML (the page's
// Content-Security-Policy enforces Trusted Types with no policy, so an innerHTML assignment
// would throw). Links and images are not rendered: their text stays text.
//
// Markdown understood (a small subset, what chat answers use): ``` / ~~~ fenced code blocks
// (also unclosed, while streaming), # headings, - * + and 1. lists (flat), > quotes, paragraphs
// (line breaks kept), `inline code`, **bold**, *italic*.

export function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const BULLET = /^ {0,3}[-*+]\s+(.*)$/;
const NUMBERED = /^ {0,3}(\d{1,9})[.)]\s+(.*)$/;
const QUOTE = /^ {0,3}>\s?(.*)$/;

export function renderMarkdown(text) {
  const root = document.createDocumentFragment();
  const lines = text.split("\n");
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    const fence = FENCE.exec(line);
    if (fence) {
      const body = [];
      i += 1;
      while (i < lines.length && !isClosing(lines[i], fence[1])) body.push(lines[i++]);
      i += 1;  // the closing fence (or the end of an unfinished block)
      root.append(codeBlock(body.join("\n"), fence[2]));
      continue;
    }
    const heading = HEADING.exec(line);
    if (heading) {
      const level = Math.min(heading[1].length + 2, 6);  // h3..h6: smaller than the page's own
      root.append(inline(el(`h${level}`), heading[2]));
      i += 1;
      continue;
    }
    if (BULLET.test(line) || NUMBERED.test(line)) {
      i = list(lines, i, root);
      continue;
    }
    if (QUOTE.test(line)) {
      const body = [];
      while (i < lines.length && QUOTE.test(lines[i])) body.push(QUOTE.exec(lines[i++])[1]);
      const quote = el("blockquote");
      quote.append(renderMarkdown(body.join("\n")));
      root.append(quote);
      continue;
    }
    if (!line.trim()) {
      i += 1;
      continue;
    }
    const body = [];
    while (i < lines.length && lines[i].trim() && !startsBlock(lines[i])) body.push(lines[i++]);
    root.append(inline(el("p"), body.join("\n")));
  }
  return root;
}

function isClosing(line, marker) {
  const m = /^ {0,3}(`{3,}|~{3,})\s*$/.exec(line);
  return m !== null && m[1][0] === marker[0] && m[1].length >= marker.length;
}

function startsBlock(line) {
  return FENCE.test(line) || HEADING.test(line) || BULLET.test(line) || NUMBERED.test(line) ||
    QUOTE.test(line);
}

function list(lines, i, root) {
  const numbered = NUMBERED.test(lines[i]);
  const node = el(numbered ? "ol" : "ul");
  if (numbered) {
    const start = parseInt(NUMBERED.exec(lines[i])[1], 10);
    if (start !== 1) node.start = start;
  }
  const items = [];
  while (i < lines.length) {
    const line = lines[i];
    const m = numbered ? NUMBERED.exec(line) : BULLET.exec(line);
    if (m) {
      items.push([numbered ? m[2] : m[1]]);
    } else if (items.length && line.trim() && /^\s+/.test(line) && !FENCE.test(line)) {
      items[items.length - 1].push(line.trim());  // an indented continuation line
    } else {
      break;
    }
    i += 1;
  }
  for (const item of items) node.append(inline(el("li"), item.join("\n")));
  root.append(node);
  return i;
}

export function codeBlock(text, language) {
  const pre = el("pre", "code");
  const code = el("code", null, text);
  if (language) pre.dataset.lang = language;
  pre.append(code);
  return pre;
}

// `code` first (nothing inside it is markup), then **bold** and *italic* in the rest.
const CODE_SPAN = /(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)/;
const EMPHASIS = /\*\*(?=\S)([\s\S]*?\S)\*\*|\*([^\s*](?:[^*]*?[^\s*])?)\*/;

export function inline(parent, text) {
  let rest = text;
  while (rest) {
    const m = CODE_SPAN.exec(rest);
    if (!m) break;
    emphasis(parent, rest.slice(0, m.index));
    parent.append(el("code", null, m[2]));
    rest = rest.slice(m.index + m[0].length);
  }
  emphasis(parent, rest);
  return parent;
}

function emphasis(parent, text) {
  let rest = text;
  while (rest) {
    const m = EMPHASIS.exec(rest);
    if (!m) break;
    if (m.index) parent.append(document.createTextNode(rest.slice(0, m.index)));
    parent.append(m[1] !== undefined ? emphasis(el("strong"), m[1]) : el("em", null, m[2]));
    rest = rest.slice(m.index + m[0].length);
  }
  if (rest) parent.append(document.createTextNode(rest));
  return parent;
}

// A reply that is one JSON object or list (a JSON answer format, or a model that answered
// in JSON): the parsed value, else undefined.
export function asJson(text) {
  const trimmed = text.trim();
  if (!/^[[{]/.test(trimmed)) return undefined;
  try {
    return JSON.parse(trimmed);
  } catch {
    return undefined;
  }
}

export function jsonBlock(value, label) {
  const box = el("div", "json-answer");
  box.append(el("div", "label", label));
  box.append(codeBlock(JSON.stringify(value, null, 2), "json"));
  return box;
}

// One tool call: its function's name and its arguments (pretty JSON when they parse).
export function toolCallCard(call) {
  const card = el("div", "tool-call");
  const head = el("div", "label", "Tool call ");
  head.append(el("code", "tool-name", call.function.name || "?"));
  card.append(head);
  let args = call.function.arguments || "";
  try {
    args = JSON.stringify(JSON.parse(args), null, 2);
  } catch {
    // partial (still streaming) or not JSON: shown as written
  }
  card.append(codeBlock(args, "json"));
  return card;
}
