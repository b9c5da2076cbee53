/**
 * `@glia/client`: the TypeScript client of the glia dispatcher's HTTP API.
 * ESM for Node 20 and browsers; it uses only fetch, streams, TextDecoder and
 * WebCrypto. See README.md.
 */

export * from "./client.js";
export * from "./errors.js";
export { DEFAULT_RETRY, transientStatus, type RetryOptions, type RetryPolicy } from "./retry.js";
export {
  DEFAULT_WEBHOOK_TOLERANCE_SECS,
  verifyWebhook,
  type VerifiedWebhook,
  type VerifyOptions,
  type WebhookHeaders,
} from "./webhooks.js";
export type { components, operations, paths } from "./generated/openapi.js";
