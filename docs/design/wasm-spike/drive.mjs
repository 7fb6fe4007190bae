// Drives the spike page in headless Debian Chromium through playwright-core.
// Usage: node drive.mjs <user-data-dir> <phase> [url]
//   phase "write":   open, insert 500 rows, probes, reload the page, check, insert 250 more
//   phase "restart": new browser process on the same profile: open and count
//   phase "panics":  the std calls that panic on wasm32-unknown-unknown
import { chromium } from 'playwright-core';

const [userDataDir, phase, url = 'http://127.0.0.1:8765/index.html'] = process.argv.slice(2);
const context = await chromium.launchPersistentContext(userDataDir, {
  executablePath: '/usr/bin/chromium',
  headless: true,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
const page = context.pages()[0] ?? await context.newPage();
page.on('console', (m) => console.log(`  [console.${m.type()}] ${m.text()}`));
page.on('pageerror', (e) => console.log(`  [pageerror] ${e.message}`));

const load = async () => {
  await page.goto(url);
  const ready = await page.evaluate(() => window.workerReady);
  if (!ready.ok) throw new Error(`worker failed: ${ready.error}`);
};
const call = async (op, ...args) => {
  const out = await page.evaluate(async ([op, args]) => {
    try { return { ok: true, value: await window.rpc(op, ...args) }; }
    catch (e) { return { ok: false, error: e.message }; }
  }, [op, args]);
  console.log(`${op}(${args.map((a) => JSON.stringify(a)).join(', ')}) ->`, JSON.stringify(out.ok ? out.value : { error: out.error }));
  return out;
};

try {
  await load();
  if (phase === 'write') {
    await call('open_store', 'rowsync', 'client.db');
    await call('insert_rows', 500, 'run1');
    await call('summary');
    await call('probe_wal');
    await call('memdb_roundtrip', 1000);
    await call('codecs_roundtrip');
    await call('probe_std_fs');
    console.log('--- page.reload() ---');
    await page.reload();
    await page.evaluate(() => window.workerReady);
    await call('open_store', 'rowsync', 'client.db');
    await call('insert_rows', 250, 'after-reload');
    await call('summary');
  } else if (phase === 'restart') {
    await call('open_store', 'rowsync', 'client.db');
    await call('summary');
    await call('insert_rows', 100, 'after-restart');
    await call('close_store');
  } else if (phase === 'bench') {
    await call('open_store', 'rowsync', 'bench.db');
    for (const n of [1, 1000, 10000]) await call('insert_rows', n, `bench-${n}`);
    await call('summary');
  } else if (phase === 'twotabs') {
    await call('open_store', 'rowsync', 'client.db');
    const second = await context.newPage();
    second.on('console', (m) => console.log(`  [tab2 console.${m.type()}] ${m.text()}`));
    await second.goto(url);
    await second.evaluate(() => window.workerReady);
    const started = Date.now();
    const out = await second.evaluate(async () => {
      try { return { ok: true, value: await window.rpc('open_store', 'rowsync', 'client.db') }; }
      catch (e) { return { ok: false, error: e.message }; }
    });
    console.log(`tab2 open_store -> ${JSON.stringify(out)} after ${Date.now() - started} ms`);
    await page.close();
    console.log('--- tab1 closed; tab2 retries');
    const retry = await second.evaluate(async () => {
      try { return { ok: true, value: await window.rpc('open_store', 'rowsync', 'client.db') }; }
      catch (e) { return { ok: false, error: e.message }; }
    });
    console.log(`tab2 open_store (retry) -> ${JSON.stringify(retry).slice(0, 300)}`);
    const open = (p) => p.evaluate(async () => {
      try { return { ok: true, value: await window.rpc('open_store', 'rowsync', 'client.db') }; }
      catch (e) { return { ok: false, error: e.message.slice(0, 120) }; }
    });
    const third = await context.newPage();
    await third.goto(url);
    await third.evaluate(() => window.workerReady);
    console.log(`tab3 open_store while tab2 (failed install) is open -> ${JSON.stringify(await open(third))}`);
    await second.close();
    await new Promise((r) => setTimeout(r, 500));
    console.log(`tab3 open_store after tab2 closed -> ${JSON.stringify(await open(third))}`);
  } else if (phase === 'mainthread') {
    const out = await page.evaluate(async () => {
      try {
        const m = await import('./pkg/rowsync_wasm_spike.js');
        await m.default();
        return { ok: true, value: await m.open_store('rowsync-main', 'main.db') };
      } catch (e) { return { ok: false, error: `${e.name}: ${e.message}` }; }
    });
    console.log(`open_store on the page's main thread -> ${JSON.stringify(out)}`);
  } else if (phase === 'panics') {
    for (const which of ['process_id', 'instant', 'system_time']) {
      await call('probe_panics', which);
      await load(); // a trapped instance is not reused
    }
  }
} finally {
  await context.close();
}
