/**
 * Retries through a dispatcher outage, as the CLI does (`cli/src/client.rs`):
 * a connection error, an attempt that timed out, a body cut off, or a
 * 502/503/504 answer is tried again with exponential backoff (200 ms doubling
 * to 3 s, plus up to as much again of random jitter; at least the
 * `Retry-After` hint) until the dispatcher answers or `maxOutageMs` have
 * passed since the outage began. Only requests whose repeat is harmless are
 * retried once they may have reached the dispatcher: reads, `PUT`, and
 * `POST`s the dispatcher deduplicates (a run or batch by its
 * `Idempotency-Key`, a decision or tool result per call, a cancel per run).
 * Any request is retried when its connection could not even be made
 * ({@link neverSent}); one that is not repeated and whose connection failed
 * after that is a {@link GliaConnectionLostError}.
 */

import { GliaConnectionLostError, GliaUnreachableError } from "./errors.js";

/** How long and how to wait out an outage. */
export interface RetryOptions {
  /** Give up when the outage has lasted this long, ms (default 120,000, the CLI's `--max-outage-secs`); 0: one attempt. */
  maxOutageMs?: number;
  /** First backoff delay, ms (default 200). */
  minDelayMs?: number;
  /** Longest backoff delay before jitter, ms (default 3,000). */
  maxDelayMs?: number;
  /** One attempt's time limit, from sending to the whole answer read (default 30,000 ms). */
  attemptTimeoutMs?: number;
}

/** {@link RetryOptions} with every default filled in. */
export type RetryPolicy = Required<RetryOptions>;

/** The defaults of {@link RetryOptions}. */
export const DEFAULT_RETRY: RetryPolicy = {
  maxOutageMs: 120_000,
  minDelayMs: 200,
  maxDelayMs: 3_000,
  attemptTimeoutMs: 30_000,
};

/** A status worth retrying: the dispatcher is restarting or not ready (503), or a gateway cannot reach it (502, 504). */
export function transientStatus(status: number): boolean {
  return status === 502 || status === 503 || status === 504;
}

/** The `Retry-After` of an answer in seconds form (the dispatcher's), in ms. */
export function retryAfterMs(response: Response): number | undefined {
  const value = response.headers.get("retry-after")?.trim();
  return value !== undefined && /^[0-9]+$/.test(value) ? Number(value) * 1000 : undefined;
}

/** The backoff before attempt `n + 1` (n from 1): exponential, capped, with jitter of up to as much again. */
export function backoffMs(policy: RetryPolicy, n: number): number {
  const base = Math.min(policy.maxDelayMs, policy.minDelayMs * 2 ** Math.min(n - 1, 20));
  return base + Math.random() * base;
}

/** Resolve after `ms`, or reject with the signal's reason when it aborts first. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** A description of a thrown fetch failure, with its causes (Node's `fetch failed` hides the reason in `cause`). */
export function describe(error: unknown): string {
  const parts: string[] = [];
  let e: unknown = error;
  for (let depth = 0; e !== undefined && e !== null && depth < 5; depth++) {
    const text = e instanceof Error ? `${e.message}${(e as { code?: unknown }).code ? ` (${String((e as { code?: unknown }).code)})` : ""}` : String(e);
    if (!parts.some((p) => p.includes(text))) {
      parts.push(text);
    }
    e = e instanceof Error ? e.cause : undefined;
  }
  return parts.join(": ");
}

/**
 * Connection errors (Node's `fetch` names them in the error's `cause`
 * chain) raised before any byte of the request was sent: the address did
 * not resolve, or nothing accepted the connection.
 */
const NEVER_SENT_CODES = new Set([
  "ECONNREFUSED",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "UND_ERR_CONNECT_TIMEOUT",
]);

/**
 * True when a thrown fetch failure shows the connection was never made, so
 * the request cannot have reached the dispatcher and even one that is not
 * idempotent may be sent again. Unknown failures (a browser's opaque
 * `TypeError`, a reset or timeout after connecting) are taken as possibly
 * sent.
 */
export function neverSent(error: unknown): boolean {
  let e: unknown = error;
  for (let depth = 0; e !== undefined && e !== null && depth < 5; depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && NEVER_SENT_CODES.has(code)) {
      return true;
    }
    e = e instanceof Error ? e.cause : undefined;
  }
  return false;
}

/** How a request is sent by {@link sendWithRetries}. */
export interface SendOptions {
  /** Repeat it through an outage once it may have reached the dispatcher (only when a repeat is harmless); any request is repeated while its connection cannot be made. */
  retry: boolean;
  /** Read the whole answer within the attempt (so a body cut off is retried); false for streams, which return at the headers. */
  buffer: boolean;
  /** The caller's cancellation. */
  signal?: AbortSignal | undefined;
  /** Called before each attempt with its number, from 1. */
  onAttempt?: (attempt: number) => void;
}

/**
 * Send `request` with `fetchImpl`, retrying transient failures per `policy`
 * when `options.retry`. Answers the first non-transient response (or the
 * last transient one when the deadline passed, or the one answer of a
 * request not retried); throws {@link GliaUnreachableError} when no attempt
 * got an answer, {@link GliaConnectionLostError} when a request not retried
 * may have been sent and got no answer, and the signal's reason when the
 * caller aborted.
 */
export async function sendWithRetries(
  fetchImpl: (request: Request) => Promise<Response>,
  request: Request,
  policy: RetryPolicy,
  baseUrl: string,
  options: SendOptions,
): Promise<Response> {
  let outageStart: number | undefined;
  for (let attempt = 1; ; attempt++) {
    options.onAttempt?.(attempt);
    const timeout = new AbortController();
    const timer = setTimeout(
      () => timeout.abort(new Error(`no answer within ${policy.attemptTimeoutMs} ms`)),
      policy.attemptTimeoutMs,
    );
    const signals = [timeout.signal, ...(options.signal ? [options.signal] : []), ...(request.signal ? [request.signal] : [])];
    const attemptRequest = new Request(request.clone(), { signal: AbortSignal.any(signals) });
    let failure: string;
    let hint: number | undefined;
    let last: Response | undefined;
    let cause: unknown;
    let maybeSent = true;
    try {
      const response = await fetchImpl(attemptRequest);
      if (!transientStatus(response.status)) {
        if (!options.buffer) {
          clearTimeout(timer);
          return response;
        }
        const body = await response.arrayBuffer();
        clearTimeout(timer);
        return new Response(response.status === 204 || response.status === 304 ? null : body, {
          status: response.status,
          statusText: response.statusText,
          headers: response.headers,
        });
      }
      const text = await response.text().catch(() => "");
      clearTimeout(timer);
      hint = retryAfterMs(response);
      failure = `${response.status} ${response.statusText}: ${text.slice(0, 300)}`;
      last = new Response(text, { status: response.status, statusText: response.statusText, headers: response.headers });
    } catch (error) {
      clearTimeout(timer);
      if (options.signal?.aborted) {
        throw options.signal.reason;
      }
      if (request.signal?.aborted) {
        throw request.signal.reason;
      }
      failure = timeout.signal.aborted ? describe(timeout.signal.reason) : describe(error);
      cause = error;
      maybeSent = timeout.signal.aborted || !neverSent(error);
    }
    if (!options.retry && last === undefined && maybeSent) {
      throw new GliaConnectionLostError({
        request: `${request.method} ${new URL(request.url).pathname}`,
        last: failure,
        cause,
      });
    }
    const now = Date.now();
    outageStart ??= now;
    const waited = now - outageStart;
    if ((!options.retry && last !== undefined) || waited >= policy.maxOutageMs) {
      if (last !== undefined) {
        return last;
      }
      throw new GliaUnreachableError({ baseUrl, attempts: attempt, waitedMs: waited, last: failure, cause });
    }
    const delay = Math.max(backoffMs(policy, attempt), hint ?? 0);
    await sleep(Math.min(delay, Math.max(0, policy.maxOutageMs - waited) + 1), options.signal);
  }
}
