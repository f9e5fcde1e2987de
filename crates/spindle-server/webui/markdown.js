// Markdown to DOM nodes, for model output: fenced code blocks, headings,
// lists, quotes, paragraphs, and inline code, bold, italics and links.
// Every piece of text becomes a text node (never HTML), so what the model
// writes cannot add elements, attributes or scripts to the page; a link
// keeps only an http(s) address and opens in a new tab without a referrer.
// A fence still open (a reply still streaming) renders as a code block.

function el(tag, className) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  return e;
}

function text(s) {
  return document.createTextNode(s);
}

const SAFE_LINK = /^https?:\/\/[^\s]+$/i;

// Inline spans of `s` appended to `parent`: `code`, **bold**, *em* / _em_,
// [label](address). Unmatched markers stay as they are.
function inline(parent, s) {
  const pattern = /(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)|\*\*([^*]+)\*\*|\*([^*\s][^*]*)\*|\b_([^_\s][^_]*)_\b|\[([^\]]+)\]\(([^)\s]+)\)/g;
  let at = 0;
  let m;
  while ((m = pattern.exec(s)) !== null) {
    if (m.index > at) parent.appendChild(text(s.slice(at, m.index)));
    if (m[1]) {
      const c = el("code");
      c.appendChild(text(m[2]));
      parent.appendChild(c);
    } else if (m[3] !== undefined) {
      const b = el("strong");
      inline(b, m[3]);
      parent.appendChild(b);
    } else if (m[4] !== undefined || m[5] !== undefined) {
      const i = el("em");
      inline(i, m[4] !== undefined ? m[4] : m[5]);
      parent.appendChild(i);
    } else if (m[6] !== undefined) {
      if (SAFE_LINK.test(m[7])) {
        const a = el("a");
        a.href = m[7];
        a.target = "_blank";
        a.rel = "noopener noreferrer nofollow";
        a.appendChild(text(m[6]));
        parent.appendChild(a);
      } else {
        parent.appendChild(text(m[0]));
      }
    }
    at = pattern.lastIndex;
  }
  if (at < s.length) parent.appendChild(text(s.slice(at)));
}

// Appends lines (joined with line breaks) to `parent` as inline text.
function lines(parent, ls) {
  ls.forEach((l, i) => {
    if (i > 0) parent.appendChild(el("br"));
    inline(parent, l);
  });
}

const FENCE = /^\s*(`{3,}|~{3,})\s*([\w+#.-]*)\s*$/;
const HEADING = /^(#{1,6})\s+(.*)$/;
const BULLET = /^\s*[-*+]\s+(.*)$/;
const NUMBERED = /^\s*(?:\d{1,9})[.)]\s+(.*)$/;
const FIRST_NUMBER = /^\s*(\d{1,9})/;
const QUOTE = /^\s*>\s?(.*)$/;

// The nodes of `source`, in a fragment.
export function renderMarkdown(source) {
  const out = document.createDocumentFragment();
  const src = source.replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  while (i < src.length) {
    const line = src[i];
    const fence = FENCE.exec(line);
    if (fence) {
      const close = fence[1];
      const body = [];
      i++;
      // The fence closes at a line of only its character, at least as many.
      const closes = (l) => {
        const t = l.trim();
        return t.length >= close.length && t === close[0].repeat(t.length);
      };
      while (i < src.length && !closes(src[i])) {
        body.push(src[i]);
        i++;
      }
      i++; // the closing fence (or the end)
      const pre = el("pre");
      const code = el("code");
      if (fence[2]) code.dataset.lang = fence[2];
      code.appendChild(text(body.join("\n")));
      pre.appendChild(code);
      out.appendChild(pre);
      continue;
    }
    if (line.trim() === "") {
      i++;
      continue;
    }
    const heading = HEADING.exec(line);
    if (heading) {
      const h = el("h" + Math.min(6, heading[1].length + 2));
      inline(h, heading[2]);
      out.appendChild(h);
      i++;
      continue;
    }
    if (BULLET.test(line) || NUMBERED.test(line)) {
      const ordered = !BULLET.test(line);
      const item = ordered ? NUMBERED : BULLET;
      const list = el(ordered ? "ol" : "ul");
      // A list may continue one started before (a reply that goes on from
      // "1." in the prompt starts at 2).
      if (ordered) list.start = Number(FIRST_NUMBER.exec(line)[1]);
      while (i < src.length && item.exec(src[i])) {
        const li = el("li");
        inline(li, item.exec(src[i])[1]);
        list.appendChild(li);
        i++;
      }
      out.appendChild(list);
      continue;
    }
    if (QUOTE.test(line)) {
      const q = el("blockquote");
      const body = [];
      while (i < src.length && QUOTE.test(src[i])) {
        body.push(QUOTE.exec(src[i])[1]);
        i++;
      }
      lines(q, body);
      out.appendChild(q);
      continue;
    }
    const para = [];
    while (
      i < src.length &&
      src[i].trim() !== "" &&
      !FENCE.test(src[i]) &&
      !HEADING.test(src[i]) &&
      !BULLET.test(src[i]) &&
      !NUMBERED.test(src[i]) &&
      !QUOTE.test(src[i])
    ) {
      para.push(src[i]);
      i++;
    }
    const p = el("p");
    lines(p, para);
    out.appendChild(p);
  }
  return out;
}
