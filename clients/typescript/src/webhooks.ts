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

/**
 * The values of header `name`, each occurrence on its own: a fetch
 * `Headers` and Node (for a header it does not know) join repeated headers
 * with ", ", which is split again here (no value of the three headers holds
 * ", ": ids and timestamps have no spaces, signatures are `v1,<base64>`).
 */
function headerValues(headers: WebhookHeaders, name: string): string[] {
  let values: readonly string[] = [];
  if (typeof (headers as Headers).get === "function") {
    const value = (headers as Headers).get(name);
    values = value === null ? [] : [value];
  } else {
    for (const [key, value] of Object.entries(headers as Record<string, string | readonly string[] | undefined>)) {
      if (key.toLowerCase() === name && value !== undefined) {
        values = values.concat(value);
      }
    }
  }
  return values.flatMap((v) => v.split(", ")).map((v) => v.trim()).filter((v) => v !== "");
}

/** The one value of header `name`; a header repeated with different values is refused (which one was signed is unknown). */
function header(headers: WebhookHeaders, name: string): string | undefined {
  const values = [...new Set(headerValues(headers, name))];
  if (values.length > 1) {
    throw new WebhookVerificationError(`${name} is repeated with different values`);
  }
  return values[0];
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
 * Throws {@link WebhookVerificationError} when a header is missing (or
 * `webhook-id` or `webhook-timestamp` is repeated with different values),
 * the secret is empty or not base64, the timestamp is further than
 * `toleranceSecs` from now (a replay), no `v1` signature matches, or the
 * body is not JSON. Signatures may come space-separated in one
 * `webhook-signature` or in repeated ones (joined with ", " by Node or a
 * fetch `Headers`).
 */
export async function verifyWebhook(
  secret: string,
  headers: WebhookHeaders,
  body: string | Uint8Array,
  options: VerifyOptions = {},
): Promise<VerifiedWebhook> {
  const id = header(headers, "webhook-id");
  const timestampText = header(headers, "webhook-timestamp");
  // Signatures: space-separated in one header, or several headers.
  const signatures = headerValues(headers, "webhook-signature").flatMap((v) => v.split(/\s+/));
  if (id === undefined || timestampText === undefined || signatures.length === 0) {
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
  if (key.length === 0) {
    throw new WebhookVerificationError("the secret is empty: pass the subscription's `whsec_…` secret");
  }
  const bodyBytes = typeof body === "string" ? new TextEncoder().encode(body) : body;
  const prefix = new TextEncoder().encode(`${id}.${timestamp}.`);
  const signed = new Uint8Array(prefix.length + bodyBytes.length);
  signed.set(prefix, 0);
  signed.set(bodyBytes, prefix.length);
  let cryptoKey: CryptoKey;
  try {
    cryptoKey = await crypto.subtle.importKey("raw", key, { name: "HMAC", hash: "SHA-256" }, false, ["verify"]);
  } catch (e) {
    throw new WebhookVerificationError(`the secret is not a usable HMAC key: ${e instanceof Error ? e.message : String(e)}`);
  }
  let matched = false;
  for (const entry of signatures) {
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
