// Starts the stand-in (or uses one already running) and speaks its own routes (`/_sim/...`,
// `/healthz`), outside Stripe's API.
//
// PROCESSOR_SIM names the binary to start (default: ../../target/debug/processor-sim from this
// folder); STAND_IN_URL, if set, is a stand-in already running, which is used as it is.
import { spawn } from 'node:child_process';
import { accessSync, constants } from 'node:fs';
import { createServer } from 'node:net';
import { fileURLToPath } from 'node:url';

const here = fileURLToPath(new URL('.', import.meta.url));

function freePort() {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

async function waitHealthy(url, child, deadlineMs = 20_000) {
  const giveUp = Date.now() + deadlineMs;
  while (Date.now() < giveUp) {
    if (child && child.exitCode !== null) throw new Error(`processor-sim exited with ${child.exitCode}`);
    try {
      const response = await fetch(`${url}/healthz`, { signal: AbortSignal.timeout(1000) });
      if (response.ok && (await response.json()).status === 'ok') return;
    } catch {
      // not listening yet
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error(`the stand-in at ${url} did not become healthy in ${deadlineMs} ms`);
}

export class StandIn {
  constructor(url, child) {
    this.url = url;
    this.child = child;
  }

  static async start() {
    if (process.env.STAND_IN_URL) {
      const url = process.env.STAND_IN_URL.replace(/\/$/, '');
      await waitHealthy(url, null);
      return new StandIn(url, null);
    }
    const binary = process.env.PROCESSOR_SIM ?? `${here}../../target/debug/processor-sim`;
    accessSync(binary, constants.X_OK); // a clear error if it is not built
    const port = await freePort();
    const child = spawn(binary, ['--port', String(port)], { stdio: 'ignore' });
    const standIn = new StandIn(`http://127.0.0.1:${port}`, child);
    try {
      await waitHealthy(standIn.url, child);
    } catch (err) {
      child.kill();
      throw err;
    }
    return standIn;
  }

  get port() {
    return Number(new URL(this.url).port);
  }

  async stop() {
    if (!this.child || this.child.exitCode !== null) return;
    const exited = new Promise((resolve) => this.child.once('exit', resolve));
    this.child.kill('SIGTERM');
    await exited;
  }

  async call(method, path, body) {
    const response = await fetch(`${this.url}${path}`, {
      method,
      headers: { 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const answer = await response.json();
    if (!response.ok) throw new Error(`${method} ${path}: ${response.status} ${JSON.stringify(answer)}`);
    return answer;
  }

  /** Forgets everything, or only what `apiKey` made. */
  reset(apiKey) {
    return this.call('POST', '/_sim/reset', apiKey ? { api_key: apiKey } : {});
  }

  /** Aims `fault` at the next request(s) that match `rule` (method, path, match, times, …). */
  aim(fault, rule = {}) {
    return this.call('POST', '/_sim/faults/aimed', { fault, ...rule });
  }

  async aimed() {
    return (await this.call('GET', '/_sim/faults/aimed')).data;
  }

  /**
   * Completes (`'complete'`) or fails (`'fail'`) a pending 3-D Secure authentication, as the
   * customer would on Stripe's test page; answers the PaymentIntent.
   */
  authenticate(intentId, outcome) {
    return this.call('POST', `/_sim/payment_intents/${intentId}/authenticate`, { outcome });
  }

  advanceClock(seconds) {
    return this.call('POST', '/_sim/clock', { advance_s: seconds });
  }

  stats() {
    return this.call('GET', '/_sim/stats');
  }
}
