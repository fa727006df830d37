// npullm_server against the official OpenAI client (npm `openai`, pinned by package-lock.json),
// run by `node --test` from ctest (tests/CMakeLists.txt: npullm_server_client):
//   NPULLM_SERVER=<npullm_server> NPULLM_MODEL=<a GGUF with a real tokenizer> node --test
// The model is the tiny Llama of npullm_run_cli (random weights, Phi-3's vocabulary): the text
// means nothing, every step is real. Each part asserts what happens to everyone else too.
import { readFileSync } from 'node:fs';
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import OpenAI from 'openai';

const SERVER = process.env.NPULLM_SERVER;
const MODEL = process.env.NPULLM_MODEL;
// Under the sanitizers everything is slower: the waits scale.
const SLOW = Number(process.env.NPULLM_SLOW || '1');

function sleep(ms) {
  return new Promise((r) => setTimeout(r, ms));
}

// Starts a server on a free port; resolves when /health says ok.
async function start(args) {
  const proc = spawn(SERVER, ['-m', MODEL, '--port', '0', '-t', '2', ...args], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let log = '';
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('no port in 30 s:\n' + log)), 30000 * SLOW);
    proc.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(/listening on http:\/\/[^:]+:(\d+)/);
      if (m) {
        clearTimeout(timer);
        resolve(Number(m[1]));
      }
    });
    proc.on('exit', (code) => reject(new Error(`server exited with ${code}:\n${log}`)));
  });
  const base = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 600; ++i) {
    try {
      const r = await fetch(base + '/health');
      if (r.status === 200) break;
    } catch {}
    await sleep(50);
  }
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
  return { proc, base, exited, log: () => log };
}

async function metrics(base, key) {
  const r = await fetch(base + '/metrics', key ? { headers: { Authorization: `Bearer ${key}` } } : {});
  const text = await r.text();
  const m = {};
  for (const line of text.split('\n')) {
    const [name, value] = line.split(' ');
    if (name && !name.startsWith('#')) m[name.replace('npullm_', '')] = Number(value);
  }
  return m;
}

// Waits until cond(metrics) holds (at most `ms`).
async function until(base, key, cond, ms = 5000) {
  let m;
  for (const t0 = Date.now(); Date.now() - t0 < ms * SLOW; await sleep(20)) {
    m = await metrics(base, key);
    if (cond(m)) return m;
  }
  return m;
}

const KEY = 'sk-npullm-test';
const messages = [{ role: 'user', content: 'Write a short poem about the sea.' }];

describe('npullm_server with the OpenAI client', () => {
  let s, client;
  before(async () => {
    s = await start(['--api-key', KEY, '--parallel', '16', '--max-queue', '16', '-c', '4096']);
    client = new OpenAI({ apiKey: KEY, baseURL: s.base + '/v1', maxRetries: 0 });
  });
  after(async () => {
    s.proc.kill('SIGTERM');
    const { code } = await s.exited;
    assert.equal(code, 0, 'exit status after SIGTERM');
  });

  test('models', async () => {
    const list = await client.models.list();
    assert.equal(list.data.length, 1);
    assert.equal(list.data[0].object, 'model');
  });

  test('chat, non-streaming: content, finish_reason, usage', async () => {
    const r = await client.chat.completions.create({ model: 'm', messages, max_tokens: 8, temperature: 0 });
    assert.equal(r.object, 'chat.completion');
    assert.equal(r.choices.length, 1);
    assert.equal(r.choices[0].message.role, 'assistant');
    assert.equal(typeof r.choices[0].message.content, 'string');
    assert.ok(['length', 'stop'].includes(r.choices[0].finish_reason));
    assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 8);
    assert.ok(r.usage.prompt_tokens > 5);
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  });

  test('streaming gives the text of the non-streaming call, then usage and [DONE]', async () => {
    const args = { model: 'm', messages, max_tokens: 12, temperature: 0, ignore_eos: true };
    const whole = await client.chat.completions.create(args);
    const stream = await client.chat.completions.create({ ...args, stream: true, stream_options: { include_usage: true } });
    let text = '';
    let finish = null;
    let usage = null;
    for await (const chunk of stream) {
      assert.equal(chunk.object, 'chat.completion.chunk');
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        text += c.delta.content ?? '';
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    assert.equal(text, whole.choices[0].message.content);
    assert.equal(finish, 'length');
    assert.equal(usage.completion_tokens, 12);
  });

  test('completions with logprobs', async () => {
    const r = await client.completions.create({ model: 'm', prompt: 'Once upon a time', max_tokens: 6, temperature: 0, logprobs: 2 });
    assert.equal(r.object, 'text_completion');
    const lp = r.choices[0].logprobs;
    assert.equal(lp.tokens.length, r.usage.completion_tokens);
    assert.equal(lp.token_logprobs.length, lp.tokens.length);
    for (const v of lp.token_logprobs) assert.ok(v <= 0);
    assert.equal(lp.tokens.join(''), r.choices[0].text);
  });

  test('chat logprobs with top_logprobs', async () => {
    const r = await client.chat.completions.create({ model: 'm', messages, max_tokens: 5, logprobs: true, top_logprobs: 3, seed: 1 });
    const content = r.choices[0].logprobs.content;
    assert.equal(content.length, r.usage.completion_tokens);
    for (const e of content) {
      assert.equal(e.top_logprobs.length, 3);
      assert.ok(e.logprob <= 0 && e.top_logprobs[0].logprob >= e.logprob);
    }
  });

  test('n = 3 with a seed: three choices, the same again with the same seed', async () => {
    const args = { model: 'm', messages, max_tokens: 10, n: 3, seed: 42, temperature: 1, ignore_eos: true };
    const a = await client.chat.completions.create(args);
    const b = await client.chat.completions.create(args);
    assert.equal(a.choices.length, 3);
    const texts = a.choices.map((c) => c.message.content);
    assert.deepEqual(b.choices.map((c) => c.message.content), texts);
    assert.ok(new Set(texts).size >= 2, 'the choices differ');
    assert.equal(a.usage.completion_tokens, 30);
  });

  test('n = 2 streamed: the choices apart by index, the texts of the non-streaming call', async () => {
    const args = { model: 'm', messages, max_tokens: 8, n: 2, seed: 9, temperature: 1, ignore_eos: true };
    const whole = await client.chat.completions.create(args);
    const stream = await client.chat.completions.create({ ...args, stream: true, stream_options: { include_usage: true } });
    const texts = ['', ''];
    const finishes = [null, null];
    let usage = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        texts[c.index] += c.delta.content ?? '';
        if (c.finish_reason) finishes[c.index] = c.finish_reason;
      }
    }
    assert.deepEqual(texts, whole.choices.map((c) => c.message.content));
    assert.deepEqual(finishes, ['length', 'length']);
    assert.equal(usage.completion_tokens, 16);
  });

  test('response_format json_schema: every streamed result parses and validates', async () => {
    const schema = {
      type: 'object',
      properties: { name: { type: 'string', maxLength: 8 }, age: { type: 'integer', minimum: 0, maximum: 120 } },
      required: ['name', 'age'],
      additionalProperties: false,
    };
    for (let seed = 0; seed < 3; ++seed) {
      const stream = await client.chat.completions.create({
        model: 'm', messages, max_tokens: 64, seed, stream: true,
        response_format: { type: 'json_schema', json_schema: { name: 'person', schema, strict: true } },
      });
      let text = '';
      for await (const chunk of stream) for (const c of chunk.choices) text += c.delta.content ?? '';
      const v = JSON.parse(text);
      assert.deepEqual(Object.keys(v), ['name', 'age']);
      assert.equal(typeof v.name, 'string');
      assert.ok(v.name.length <= 8);
      assert.ok(Number.isInteger(v.age) && v.age >= 0 && v.age <= 120);
    }
  });

  test('tools with tool_choice required: a well-formed call', async () => {
    const tools = [{
      type: 'function',
      function: {
        name: 'get_weather',
        description: 'The weather in a city',
        parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 12 } }, required: ['city'], additionalProperties: false },
      },
    }];
    const r = await client.chat.completions.create({ model: 'm', messages, tools, tool_choice: 'required', max_tokens: 64, seed: 5 });
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'tool_calls');
    assert.equal(c.message.tool_calls.length, 1);
    assert.equal(c.message.tool_calls[0].type, 'function');
    assert.equal(c.message.tool_calls[0].function.name, 'get_weather');
    const args = JSON.parse(c.message.tool_calls[0].function.arguments);
    assert.equal(typeof args.city, 'string');
  });

  test('errors are the client\'s typed exceptions', async () => {
    const wrong = new OpenAI({ apiKey: 'sk-wrong', baseURL: s.base + '/v1', maxRetries: 0 });
    await assert.rejects(wrong.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
    await assert.rejects(
      client.chat.completions.create({ model: 'm', messages, temperature: 'hot' }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === 'temperature');
    await assert.rejects(
      client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'x '.repeat(5000) }], max_tokens: 10 }),
      (e) => e instanceof OpenAI.BadRequestError && e.code === 'context_length_exceeded' && /4096/.test(e.message));
    await assert.rejects(client.get('/nothing-here'), (e) => e instanceof OpenAI.NotFoundError);
    await assert.rejects(
      client.chat.completions.create({ model: 'm', messages, response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', properties: { a: { $ref: '#/nowhere' } }, required: ['a'] } } } }),
      (e) => e instanceof OpenAI.BadRequestError);
    const health = await fetch(s.base + '/health');  // open without the key
    assert.equal(health.status, 200);
  });

  test('tokenize, detokenize, apply-template', async () => {
    const h = { Authorization: `Bearer ${KEY}`, 'Content-Type': 'application/json' };
    const t = await (await fetch(s.base + '/tokenize', { method: 'POST', headers: h, body: JSON.stringify({ content: 'Hello world' }) })).json();
    assert.ok(t.tokens.length >= 2);
    const d = await (await fetch(s.base + '/detokenize', { method: 'POST', headers: h, body: JSON.stringify({ tokens: t.tokens }) })).json();
    assert.match(d.content, /Hello world/);
    const a = await (await fetch(s.base + '/apply-template', { method: 'POST', headers: h, body: JSON.stringify({ messages }) })).json();
    assert.match(a.prompt, /poem about the sea/);
    // Bodies nested past the limit are refused before the JSON parser recurses into them.
    for (const path of ['/tokenize', '/detokenize', '/apply-template', '/v1/completions']) {
      const r = await fetch(s.base + path, { method: 'POST', headers: h, body: '{"content": ' + '['.repeat(200000) });
      assert.equal(r.status, 400, path);
      assert.match((await r.json()).error.message, /nested deeper than 64/);
    }
  });

  test('output does not depend on the load: alone and among 15 others, the same tokens and logprobs', async () => {
    const probes = [
      { model: 'm', messages, max_tokens: 10, temperature: 0, logprobs: true, top_logprobs: 2, ignore_eos: true },
      { model: 'm', messages, max_tokens: 10, temperature: 0.9, seed: 11, logprobs: true, top_logprobs: 2, ignore_eos: true },
    ];
    const alone = [];
    for (const p of probes) alone.push(await client.chat.completions.create(p));
    const others = [];
    for (let i = 0; i < 15; ++i) {
      others.push(client.chat.completions.create({
        model: 'm', messages: [{ role: 'user', content: `Other request ${i} ` + 'word '.repeat(i * 7) }],
        max_tokens: 16, seed: i, ignore_eos: true,
      }));
    }
    const busy = await Promise.all([...probes.map((p) => client.chat.completions.create(p)), ...others]);
    for (let k = 0; k < probes.length; ++k) {
      assert.equal(busy[k].choices[0].message.content, alone[k].choices[0].message.content);
      assert.deepEqual(busy[k].choices[0].logprobs, alone[k].choices[0].logprobs);
    }
  });

  test('a shared prompt prefix is prefilled once (prefix cache)', async () => {
    // (Phi-3's template drops system messages: the shared part leads the user's message.)
    const shared = 'You are a careful assistant. '.repeat(40);
    const before = await metrics(s.base, KEY);
    await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: shared + 'first' }], max_tokens: 2 });
    const mid = await metrics(s.base, KEY);
    await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: shared + 'second' }], max_tokens: 2 });
    const end = await metrics(s.base, KEY);
    assert.ok(mid.prompt_tokens_total - before.prompt_tokens_total > 200);
    assert.ok(end.prompt_tokens_cached_total - mid.prompt_tokens_cached_total > 150, 'reused from the cache');
    assert.ok(end.prompt_tokens_total - mid.prompt_tokens_total < 50, 'only what differs computed');
    // cache_prompt: false computes the whole prompt again.
    await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: shared + 'third' }], max_tokens: 2, cache_prompt: false });
    const last = await metrics(s.base, KEY);
    assert.ok(last.prompt_tokens_total - end.prompt_tokens_total > 200);
    assert.equal(last.prompt_tokens_cached_total, end.prompt_tokens_cached_total);
  });
});

describe('npullm_server with a draft model (--draft)', () => {
  // The model as its own draft: every greedy proposal is the model's own choice.
  let plain, spec;
  before(async () => {
    [plain, spec] = await Promise.all([start(['--parallel', '4']),
      start(['--parallel', '4', '--draft', MODEL, '--draft-max', '3'])]);
  });
  after(async () => {
    for (const s of [plain, spec]) {
      s.proc.kill('SIGTERM');
      assert.equal((await s.exited).code, 0);
    }
  });

  test('greedy: the text of the plain server, most proposals accepted; seeded: reproducible', async () => {
    const a = new OpenAI({ apiKey: 'none', baseURL: plain.base + '/v1', maxRetries: 0 });
    const b = new OpenAI({ apiKey: 'none', baseURL: spec.base + '/v1', maxRetries: 0 });
    const greedy = { model: 'm', messages, max_tokens: 40, temperature: 0, ignore_eos: true };
    const [ra, rb] = await Promise.all([a.chat.completions.create(greedy), b.chat.completions.create(greedy)]);
    assert.equal(rb.choices[0].message.content, ra.choices[0].message.content);
    assert.equal(rb.usage.completion_tokens, 40);
    const m = await metrics(spec.base);
    assert.ok(m.draft_tokens_proposed_total >= 20, `proposed ${m.draft_tokens_proposed_total}`);
    assert.ok(m.draft_tokens_accepted_total >= 0.9 * m.draft_tokens_proposed_total,
      `accepted ${m.draft_tokens_accepted_total} of ${m.draft_tokens_proposed_total}`);
    assert.ok(m.engine_steps_total < 30, `40 tokens in ${m.engine_steps_total} steps`);
    const seeded = { model: 'm', prompt: 'The sea', max_tokens: 24, temperature: 0.9, seed: 11, ignore_eos: true, stream: true };
    const texts = [];
    for (let i = 0; i < 2; ++i) {
      let t = '';
      for await (const c of await b.completions.create(seeded)) t += c.choices[0]?.text ?? '';
      texts.push(t);
    }
    assert.equal(texts[0], texts[1]);
    assert.ok(texts[0].length > 0);
  });
});

describe('npullm_server under load and faults', () => {
  let s, client;
  before(async () => {
    s = await start(['--parallel', '4', '--max-queue', '8', '-c', '2048']);
    client = new OpenAI({ apiKey: 'none', baseURL: s.base + '/v1', maxRetries: 0 });
  });

  test('a client that hangs up mid-stream: its request is cancelled and its blocks freed', async () => {
    const controller = new AbortController();
    const stream = await client.chat.completions.create(
      { model: 'm', messages, max_tokens: 1500, ignore_eos: true, stream: true }, { signal: controller.signal });
    let n = 0;
    try {  // the client ends the iteration (or throws) once aborted
      for await (const chunk of stream) if (++n === 5) controller.abort();
    } catch {}
    assert.equal(n, 5);
    const m = await until(s.base, null, (m) => m.requests_cancelled_total >= 1 && m.requests_running === 0);
    assert.equal(m.requests_cancelled_total, 1);
    assert.equal(m.requests_running, 0);
    assert.ok(m.generated_tokens_total < 1500, 'it stopped well before its 1500 tokens');
  });

  test('a non-streaming client that hangs up: cancelled too', async () => {
    const controller = new AbortController();
    const before = await metrics(s.base);
    const p = client.completions.create({ model: 'm', prompt: 'Long story:', max_tokens: 1500, ignore_eos: true }, { signal: controller.signal });
    await sleep(300 * SLOW);
    controller.abort();
    await assert.rejects(p);
    const m = await until(s.base, null, (m) => m.requests_cancelled_total > before.requests_cancelled_total && m.requests_running === 0);
    assert.equal(m.requests_cancelled_total, before.requests_cancelled_total + 1);
    assert.equal(m.requests_running, 0);
  });

  test('a client that hangs up before its prompt is computed: cancelled, its prompt never prefilled, the others go on', async () => {
    // Four long streams fill the four slots; a fifth request with a ~1,000-token prompt waits.
    const before = await metrics(s.base);
    const ctrls = [0, 1, 2, 3].map(() => new AbortController());
    const busy = await Promise.all(ctrls.map((c) => client.chat.completions.create(
      { model: 'm', messages, max_tokens: 1500, ignore_eos: true, stream: true }, { signal: c.signal })));
    let m = await until(s.base, null, (m) => m.requests_running === 4);
    assert.equal(m.requests_running, 4);
    const queued = new AbortController();
    const p = client.chat.completions.create(
      { model: 'm', messages: [{ role: 'user', content: 'sea '.repeat(1000) }], max_tokens: 8, stream: true },
      { signal: queued.signal }).catch(() => null);
    m = await until(s.base, null, (m) => m.requests_waiting >= 1);
    assert.equal(m.requests_waiting, 1);
    queued.abort();
    await p;
    // (The counters move at once, the gauges at the end of the engine's step.)
    m = await until(s.base, null, (m) => m.requests_cancelled_total > before.requests_cancelled_total && m.requests_waiting === 0);
    assert.equal(m.requests_cancelled_total, before.requests_cancelled_total + 1, 'the waiting one is cancelled');
    assert.equal(m.requests_waiting, 0);
    assert.equal(m.requests_running, 4, 'the four streams go on');
    assert.ok(m.prompt_tokens_total - before.prompt_tokens_total < 500, 'its 1,000-token prompt was never computed');
    // The four streams still deliver after the cancellation; then their clients hang up too.
    let chunks = 0;
    for await (const chunk of busy[0]) if (++chunks === 3) break;
    assert.equal(chunks, 3);
    ctrls.forEach((c) => c.abort());
    m = await until(s.base, null, (m) => m.requests_running === 0 && m.kv_blocks_free === m.kv_blocks_total);
    assert.equal(m.requests_cancelled_total, before.requests_cancelled_total + 5);
    assert.equal(m.kv_blocks_free, m.kv_blocks_total, 'every block back in the pool (cached prefixes are free)');
  });

  test('a grammar the matcher gives up on fails its own request only', async () => {
    // A nullable chain of counted repetitions: more parse positions after one character than
    // the matcher's budget (capacity_exhausted), found by fuzz_grammar. Here it gives up at the
    // first mask, so the request is refused (400) before it runs; a matcher giving up later
    // ends its own request with an error object (test_generate's
    // ARequestWhoseSamplingRaisesFailsAlone and serve::engine), the others go on.
    const grammar = readFileSync(new URL('../grammar/corpus_grammar/gbnf-match-budget-nullable-counted-chain',
      import.meta.url)).subarray(1).toString('latin1');
    const other = client.chat.completions.create({ model: 'm', messages, max_tokens: 24, temperature: 0, ignore_eos: true });
    const r = await fetch(s.base + '/v1/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt: 'Say a', max_tokens: 8, grammar }) });
    const body = JSON.parse(await r.text());
    assert.equal(r.status, 400);
    assert.ok(body.error, `an error object, got ${JSON.stringify(body).slice(0, 200)}`);
    assert.match(body.error.message, /parse positions|budget|capacity/);
    const ok = await other;
    assert.equal(ok.usage.completion_tokens, 24, 'the other request is served whole');
  });

  test('64 concurrent clients against 4 slots and a queue of 8: every answer 200 or 503, none dropped', async () => {
    const results = await Promise.allSettled(Array.from({ length: 64 }, async (_, i) => {
      const stream = await client.chat.completions.create({
        model: 'm', messages: [{ role: 'user', content: `Client ${i}` }], max_tokens: 24, ignore_eos: true, stream: true,
      });
      let chunks = 0;
      let finish = null;
      for await (const c of stream) {
        ++chunks;
        if (c.choices[0]?.finish_reason) finish = c.choices[0].finish_reason;
      }
      return { chunks, finish };
    }));
    let ok = 0, busy = 0;
    for (const r of results) {
      if (r.status === 'fulfilled') {
        assert.equal(r.value.finish, 'length');
        ++ok;
      } else {
        assert.ok(r.reason instanceof OpenAI.APIError && r.reason.status === 503, String(r.reason));
        assert.equal(r.reason.headers.get('retry-after'), '1');
        ++busy;
      }
    }
    assert.equal(ok + busy, 64);
    assert.ok(ok >= 12, `at least parallel + queue answered (${ok})`);
    const m = await until(s.base, null, (m) => m.requests_running === 0 && m.requests_waiting === 0);
    assert.equal(m.requests_rejected_busy_total, busy);
  });

  test('malformed requests interleaved with good ones: every good one correct', async () => {
    const good = { model: 'm', messages, max_tokens: 6, temperature: 0 };
    const expected = (await client.chat.completions.create(good)).choices[0].message.content;
    const bad = [
      '{', '[]', '{"messages": 5}', '{"messages": []}', '{"messages": [{"role": 1}]}',
      '{"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}',
      '{"messages": [{"role": "user", "content": "x"}], "n": 1000}',
      '{"messages": [{"role": "user", "content": "x"}], "stop": [1, 2]}',
      '{"messages": [{"role": "user", "content": "x"}], "logit_bias": {"abc": 1}}',
      '{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}}}',
      '{"messages": [{"role": "user", "content": "x"}], "grammar": "root ::= ("}',
      '[' .repeat(100000),
      '{"messages": [{"role": "user", "content": "' + 'x'.repeat(9 << 20) + '"}]}',
    ];
    const jobs = [];
    for (let i = 0; i < 1000; ++i) {
      if (i % 10 === 0) {
        jobs.push(client.chat.completions.create(good).then((r) => ({ good: r.choices[0].message.content })));
      } else {
        const body = bad[i % bad.length];
        jobs.push(fetch(s.base + '/v1/chat/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body })
          .then(async (r) => ({ status: r.status, body: await r.text() })));
      }
      if (jobs.length >= 32) await Promise.all(jobs.splice(0, 16)).then((rs) => rs.forEach(check));
    }
    (await Promise.all(jobs)).forEach(check);
    function check(r) {
      if ('good' in r) return assert.equal(r.good, expected);
      assert.ok(r.status === 400 || r.status === 413, `status ${r.status}: ${r.body.slice(0, 200)}`);
      const e = JSON.parse(r.body).error;
      assert.equal(typeof e.message, 'string');
    }
  });

  test('SIGTERM under load: running streams finish with [DONE], then exit 0', async () => {
    const streams = Array.from({ length: 4 }, (_, i) => (async () => {
      const stream = await client.chat.completions.create({
        model: 'm', messages: [{ role: 'user', content: `Drain ${i}` }], max_tokens: 40, ignore_eos: true, stream: true,
      });
      let finish = null;
      for await (const c of stream) if (c.choices[0]?.finish_reason) finish = c.choices[0].finish_reason;
      return finish;
    })());
    await until(s.base, null, (m) => m.requests_running === 4, 5000);
    s.proc.kill('SIGTERM');
    const finishes = await Promise.all(streams);
    assert.deepEqual(finishes, ['length', 'length', 'length', 'length']);
    const { code } = await s.exited;
    assert.equal(code, 0);
  });
});
