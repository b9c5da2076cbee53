/**
 * Standard Webhooks signature verification (https://www.standardwebhooks.com/),
 * as the dispatcher signs its deliveries (`dispatcher/src/webhooks.rs`):
 *
 * - `webhook-id`: the delivery's message id, the same on every retry;
 * - `webhook-timestamp`: Unix seconds of this attempt;
 * - `webhook-signature`: space-separated `v1,<base64 HMAC-SHA256>` entries,
 *   signed over `"{id}.{timestamp}.{body}"` with the key that is the base64
 *   part of the subscription's `whsec_…` secret.
 *
 * Uses WebCrypto (`crypto.subtle`) only, so it runs in Node 20 and browsers.
 */

import { WebhookVerificationError } from "./errors.js";

/** The default tolerance of `webhook-timestamp` against the clock, seconds (the specification's 5 minutes). */
export const DEFAULT_WEBHOOK_TOLERANCE_SECS = 300;

/** Headers as a fetch `Headers`, or a plain object as Node's `IncomingMessage.headers` (names in any case). */
export type WebhookHeaders =
  | Headers
  | Record<string, string | readonly string[] | undefined>;

/** Options of {@link verifyWebhook}. */
export interface VerifyOptions {
  /** Accept a `webhook-timestamp` at most this many seconds from now, before or after (default 300). */
  toleranceSecs?: number;
  /** The current time, Unix ms (default `Date.now()`); for tests. */
  nowMs?: number;
}

/** A verified delivery: its id (use it to drop repeats), time, and body parsed as JSON. */
export interface VerifiedWebhook {
  /** `webhook-id`: the same on every retry of one delivery. */
  id: string;
  /** `webhook-timestamp`, Unix seconds. */
  timestamp: number;
  /** The body, parsed as JSON. */
  payload: unknown;
}

function header(headers: WebhookHeaders, name: string): string | undefined {
  if (typeof (headers as Headers).get === "function") {
    return (headers as Headers).get(name) ?? undefined;
  }
  const record = headers as Record<string, string | readonly string[] | undefined>;
  for (const [key, value] of Object.entries(record)) {
    if (key.toLowerCase() === name) {
      return typeof value === "string" ? value : value?.join(", ");
    }
  }
  return undefined;
}

function fromBase64(text: string): Uint8Array<ArrayBuffer> {
  const binary = atob(text);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) {
    bytes[i] = binary.charCodeAt(i);
  }
  return bytes;
}

/**
 * Verify a delivery and parse its body.
 *
 * `secret` is the subscription's `whsec_…` secret (shown once, by
 * `POST /v1/webhooks`); `body` the raw body exactly as received (bytes or
 * the undecoded text: parse and re-serialise it and the signature breaks).
 * Throws {@link WebhookVerificationError} when a header is missing, the
 * timestamp is further than `toleranceSecs` from now (a replay), no `v1`
 * signature matches, or the body is not JSON.
 */
export async function verifyWebhook(
  secret: string,
  headers: WebhookHeaders,
  body: string | Uint8Array,
  options: VerifyOptions = {},
): Promise<VerifiedWebhook> {
  const id = header(headers, "webhook-id");
  const timestampText = header(headers, "webhook-timestamp");
  const signatures = header(headers, "webhook-signature");
  if (id === undefined || timestampText === undefined || signatures === undefined) {
    throw new WebhookVerificationError(
      "missing header: a delivery carries webhook-id, webhook-timestamp and webhook-signature",
    );
  }
  if (!/^[0-9]{1,15}$/.test(timestampText.trim())) {
    throw new WebhookVerificationError(`webhook-timestamp ${JSON.stringify(timestampText)} is not Unix seconds`);
  }
  const timestamp = Number(timestampText.trim());
  const tolerance = options.toleranceSecs ?? DEFAULT_WEBHOOK_TOLERANCE_SECS;
  const now = Math.floor((options.nowMs ?? Date.now()) / 1000);
  if (Math.abs(now - timestamp) > tolerance) {
    throw new WebhookVerificationError(
      `webhook-timestamp ${timestamp} is ${now - timestamp} s from now, beyond the tolerance of ${tolerance} s`,
    );
  }
  let key: Uint8Array<ArrayBuffer>;
  try {
    key = fromBase64(secret.startsWith("whsec_") ? secret.slice("whsec_".length) : secret);
  } catch {
    throw new WebhookVerificationError("the secret is not `whsec_` and base64");
  }
  const bodyBytes = typeof body === "string" ? new TextEncoder().encode(body) : body;
  const prefix = new TextEncoder().encode(`${id}.${timestamp}.`);
  const signed = new Uint8Array(prefix.length + bodyBytes.length);
  signed.set(prefix, 0);
  signed.set(bodyBytes, prefix.length);
  const cryptoKey = await crypto.subtle.importKey("raw", key, { name: "HMAC", hash: "SHA-256" }, false, ["verify"]);
  let matched = false;
  for (const entry of signatures.split(" ")) {
    const comma = entry.indexOf(",");
    if (comma < 0 || entry.slice(0, comma) !== "v1") {
      continue;
    }
    let signature: Uint8Array<ArrayBuffer>;
    try {
      signature = fromBase64(entry.slice(comma + 1));
    } catch {
      continue;
    }
    // crypto.subtle.verify compares in constant time.
    if (await crypto.subtle.verify("HMAC", cryptoKey, signature, signed)) {
      matched = true;
      break;
    }
  }
  if (!matched) {
    throw new WebhookVerificationError("no v1 signature in webhook-signature matches the body");
  }
  let payload: unknown;
  try {
    payload = JSON.parse(new TextDecoder().decode(bodyBytes));
  } catch {
    throw new WebhookVerificationError("the signed body is not JSON");
  }
  return { id, timestamp, payload };
}
