// Page side: a promise-based RPC to the worker; window.rpc(op, ...args).
const worker = new Worker(new URL('./worker.js', import.meta.url), { type: 'module' });
let next = 1;
const pending = new Map();
let readyResolve;
window.workerReady = new Promise((resolve) => { readyResolve = resolve; });
worker.onmessage = ({ data }) => {
  if (data.id === 0) { readyResolve(data); return; }
  const { resolve, reject } = pending.get(data.id);
  pending.delete(data.id);
  data.ok ? resolve(data.result) : reject(new Error(data.error));
};
worker.onerror = (e) => console.error('worker error', e.message);
window.rpc = (op, ...args) => new Promise((resolve, reject) => {
  const id = next++;
  pending.set(id, { resolve, reject });
  worker.postMessage({ id, op, args });
});
document.getElementById('status').textContent = 'worker started';
