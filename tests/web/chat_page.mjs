// The chat page of `ember serve` in a real browser (Debian's chromium driven by playwright-core),
// against a real server on a tiny model started with an API key:
//   node chat_page.mjs URL API_KEY USER_DATA_DIR
// Checks: the page asks for the key; an answer streams (text shows while Stop is still enabled)
// and finishes with its figures; Stop ends an answer early and the server cancels the request;
// a reload keeps the conversation; a second conversation, and going back to the first; a server
// error (a temperature out of range) shown to the user; Markdown from a model rendered with its
// HTML escaped. The renderer's escaping is also checked directly (markdown.mjs beside this file).
import { chromium } from 'playwright-core';
import assert from 'node:assert/strict';
import { renderMarkdown } from './markdown.mjs';

const [url, key, profile] = process.argv.slice(2);

// The renderer alone: escaping first, then markup.
{
  const html = renderMarkdown('**bold** `<b>` <img src=x onerror=alert(1)>\n\n```js\nif (a < b) {}\n```\n- one\n- two');
  assert.ok(html.includes('<strong>bold</strong>'), html);
  assert.ok(html.includes('<code>&lt;b&gt;</code>'), html);
  assert.ok(html.includes('&lt;img src=x onerror=alert(1)&gt;'), html);
  assert.ok(html.includes('<pre><code class="language-js">if (a &lt; b) {}</code></pre>'), html);
  assert.ok(html.includes('<ul><li>one</li><li>two</li></ul>'), html);
  assert.equal(renderMarkdown('[x](javascript:alert(1))'), '<p>[x](javascript:alert(1))</p>');
  assert.equal(renderMarkdown('[x](https://a.example/?q=1&r=2)'),
    '<p><a href="https://a.example/?q=1&amp;r=2" rel="noopener noreferrer" target="_blank">x</a></p>');
  assert.equal(renderMarkdown('```\nunclosed <fence>'), '<pre><code>unclosed &lt;fence&gt;</code></pre>');
}

const context = await chromium.launchPersistentContext(profile, {
  executablePath: '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update',
    '--disable-sync', '--no-first-run'],
});
const failures = [];
const page = context.pages()[0] ?? await context.newPage();
page.on('pageerror', (e) => failures.push(`page error: ${e.message}`));
// nothing but the server itself may be asked for anything
context.on('request', (r) => { if (!r.url().startsWith(url)) failures.push(`request outside the server: ${r.url()}`); });
page.setDefaultTimeout(20000);

const stats = (n) => page.locator('.message.assistant .stats').nth(n);
const answerDone = async (n) => {
  await page.waitForFunction((i) => {
    const s = document.querySelectorAll('.message.assistant')[i];
    return s && !s.querySelector('.stats')?.textContent.includes('generating') && !document.querySelector('#send').disabled;
  }, n);
};
// the settings live in a <details> that a reload closes again
const setting = async (id, value) => {
  if ((await page.locator('#settings').getAttribute('open')) === null) await page.click('#settings summary');
  await page.fill(id, value);
};
const send = async (text) => {
  await page.fill('#input', text);
  await page.press('#input', 'Enter');
};

try {
  await page.goto(url);
  // the key: asked for, then given
  await page.locator('#key-needed').waitFor({ state: 'visible' });
  await page.fill('#api-key', key);
  await page.waitForFunction(() => document.querySelector('#model').textContent.startsWith('model: '));
  assert.equal(await page.textContent('#model'), 'model: tiny-llama');
  await setting('#temperature', '0');
  await setting('#max-tokens', '12');

  // 1. an answer streams and finishes with its figures
  await send('Hello there');
  await answerDone(0);
  const first = await stats(0).textContent();
  assert.match(first, /^12 tokens · [\d.]+ tok\/s · prompt \d+ tokens, \d+ cached · first token \d+ ms$/, first);
  assert.ok((await page.locator('.message.assistant .content').first().textContent()).length > 0);
  assert.equal(await page.locator('.message.user .content').first().textContent(), 'Hello there');

  // 2. a long answer: text arrives while it is still running (streaming); Stop ends it
  await setting('#max-tokens', '6000'); // long enough to still run when Stop is clicked on a loaded machine
  await send('Tell me a long story');
  await page.waitForFunction(() => {
    const all = document.querySelectorAll('.message.assistant .content');
    return all.length === 2 && all[1].textContent.length > 0 && !document.querySelector('#stop').disabled;
  });
  await page.click('#stop');
  await answerDone(1);
  const stopped = await stats(1).textContent();
  assert.match(stopped, /stopped/, stopped);
  assert.ok((await page.locator('.message.assistant .content').nth(1).textContent()).length > 0);
  // the server saw the hang-up and cancelled the request
  let cancelled = 0;
  for (let i = 0; i < 50 && !cancelled; i++) {
    const metrics = await (await fetch(`${url}/metrics`)).text();
    cancelled = Number(metrics.match(/^ember_requests_cancelled_total (\d+)/m)?.[1] ?? 0);
    if (!cancelled) await new Promise((r) => setTimeout(r, 100));
  }
  assert.ok(cancelled >= 1, 'the stopped request was not cancelled on the server');

  // 3. a reload keeps the conversation (and the settings)
  await page.reload();
  await page.locator('.message').nth(3).waitFor();
  assert.equal(await page.locator('.message').count(), 4);
  assert.equal(await page.inputValue('#max-tokens'), '6000');
  assert.equal(await page.locator('.conversation').count(), 1);
  assert.equal(await page.locator('.conversation .open').first().textContent(), 'Hello there');

  // 4. a second conversation, then back to the first (Alt+N opens a new one)
  await setting('#max-tokens', '6');
  await page.keyboard.press('Alt+N');
  assert.equal(await page.locator('.message').count(), 0);
  await send('Second conversation');
  await answerDone(0);
  assert.match(await stats(0).textContent(), /^6 tokens/);
  assert.equal(await page.locator('.conversation').count(), 2);
  assert.equal(await page.locator('.conversation .open').first().textContent(), 'Second conversation');
  await page.locator('.conversation .open').nth(1).click();
  assert.equal(await page.locator('.message').count(), 4);
  assert.equal(await page.locator('.message.user .content').first().textContent(), 'Hello there');

  // 5. an error from the server is shown to the user
  await setting('#temperature', '7');
  await send('This request has a bad temperature');
  await page.locator('.message.assistant .error').waitFor();
  const error = await page.locator('.message.assistant .error').textContent();
  assert.match(error, /^Error: .*temperature/, error);
  await setting('#temperature', '0');

  // 6. a model's Markdown is rendered and its HTML stays text
  await page.evaluate(() => {
    const conversations = JSON.parse(localStorage.getItem('ember.conversations'));
    const shown = conversations.find((c) => c.id === JSON.parse(localStorage.getItem('ember.current')));
    shown.messages.push({ role: 'assistant', content: '# Title\n<img src=x onerror="window.hacked=1">\n```c\nint x;\n```' });
    localStorage.setItem('ember.conversations', JSON.stringify(conversations));
  });
  await page.reload();
  const last = page.locator('.message.assistant .content').last();
  await last.locator('pre code').waitFor();
  assert.equal(await last.locator('h1').textContent(), 'Title');
  assert.equal(await last.locator('img').count(), 0);
  assert.equal(await last.locator('pre code.language-c').textContent(), 'int x;');
  assert.equal(await page.evaluate(() => window.hacked), undefined);
} catch (e) {
  failures.push(e.stack ?? String(e));
} finally {
  await context.close();
}
if (failures.length) {
  console.log(`FAIL: ${failures.join('\n')}`);
  process.exit(1);
}
console.log('chat page: key, streaming, stop, reload, two conversations, server error, Markdown: ok');
