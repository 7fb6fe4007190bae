// Dedicated module worker: owns the wasm module, the sahpool VFS and the connection.
// OPFS sync access handles (FileSystemSyncAccessHandle) exist only in dedicated workers.
import init, * as spike from './pkg/rowsync_wasm_spike.js';

const ready = init(); // fetches and instantiates pkg/rowsync_wasm_spike_bg.wasm

self.onmessage = async (event) => {
  const { id, op, args } = event.data;
  try {
    await ready;
    const fn = spike[op];
    if (typeof fn !== 'function') throw new Error(`no export ${op}`);
    const result = await fn(...(args ?? []));
    self.postMessage({ id, ok: true, result: JSON.parse(result) });
  } catch (error) {
    self.postMessage({ id, ok: false, error: `${error?.name ?? 'Error'}: ${error?.message ?? error}` });
  }
};
ready.then(
  () => self.postMessage({ id: 0, ok: true, result: 'ready' }),
  (error) => self.postMessage({ id: 0, ok: false, error: String(error) }),
);
