// A small Markdown renderer for the chat page. Safety first: the whole text is HTML-escaped before
// anything is recognised, so a model's (or a user's) output can never inject markup; the renderer
// only adds its own tags around escaped text. Links become anchors only for http(s) URLs.
// Recognised: fenced code blocks (an unclosed fence runs to the end, as while streaming), headings,
// bullet and numbered lists, quotes, paragraphs; inline code, bold, italic, links.

const ESCAPES = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };

export function escapeHtml(text) {
  return text.replace(/[&<>"']/g, (c) => ESCAPES[c]);
}

// Inline markup of one escaped block. Code spans are set aside first so that nothing inside them
// is read as markup.
function inline(text) {
  const spans = [];
  text = text.replace(/`([^`\n]+)`/g, (_, code) => `\u0000${spans.push(code) - 1}\u0000`);
  text = text
    .replace(/\*\*([^*\n]+)\*\*/g, '<strong>$1</strong>')
    .replace(/(^|[^*\w])\*([^*\n]+)\*(?![\w*])/g, '$1<em>$2</em>')
    .replace(/\[([^\]\n]+)\]\((https?:\/\/[^\s()]+)\)/g,
      '<a href="$2" rel="noopener noreferrer" target="_blank">$1</a>');
  return text.replace(/\u0000(\d+)\u0000/g, (_, i) => `<code>${spans[Number(i)]}</code>`);
}

export function renderMarkdown(source) {
  // NUL is the placeholder marker above; a byte token may produce it, and it has no text to show
  const lines = escapeHtml(source.replace(/\u0000/g, '').replace(/\r\n?/g, '\n')).split('\n');
  const out = [];
  let paragraph = [];
  const flush = () => {
    if (paragraph.length) out.push(`<p>${inline(paragraph.join('\n')).replace(/\n/g, '<br>')}</p>`);
    paragraph = [];
  };
  for (let i = 0; i < lines.length;) {
    const line = lines[i];
    let m;
    if ((m = line.match(/^\s*```\s*([\w+#.-]*)\s*$/))) {
      flush();
      const code = [];
      for (i++; i < lines.length && !/^\s*```\s*$/.test(lines[i]); i++) code.push(lines[i]);
      i++; // the closing fence
      out.push(`<pre><code${m[1] ? ` class="language-${m[1]}"` : ''}>${code.join('\n')}</code></pre>`);
    } else if ((m = line.match(/^(#{1,6})\s+(.*)$/))) {
      flush();
      out.push(`<h${m[1].length}>${inline(m[2])}</h${m[1].length}>`);
      i++;
    } else if (/^\s*(?:[-*+]|\d+[.)])\s+/.test(line)) {
      flush();
      const ordered = /^\s*\d/.test(line), items = [];
      for (; i < lines.length && (m = lines[i].match(/^\s*(?:[-*+]|\d+[.)])\s+(.*)$/)); i++) items.push(`<li>${inline(m[1])}</li>`);
      out.push(ordered ? `<ol>${items.join('')}</ol>` : `<ul>${items.join('')}</ul>`);
    } else if (/^&gt; ?/.test(line)) {
      flush();
      const quoted = [];
      for (; i < lines.length && /^&gt; ?/.test(lines[i]); i++) quoted.push(lines[i].replace(/^&gt; ?/, ''));
      out.push(`<blockquote>${inline(quoted.join('\n')).replace(/\n/g, '<br>')}</blockquote>`);
    } else if (!line.trim()) {
      flush();
      i++;
    } else {
      paragraph.push(line);
      i++;
    }
  }
  flush();
  return out.join('\n');
}
