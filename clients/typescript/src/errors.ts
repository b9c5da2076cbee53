/**
 * Errors of the glia client.
 *
 * Every error the dispatcher answers is `{"error": {"code", "message",
 * "field"?, "line"?}}` with an HTTP status (`dispatcher/src/error.rs`); the
 * client throws it as a {@link GliaError}. A dispatcher that could not be
 * reached within the retry deadline is a {@link GliaUnreachableError}; a
 * request that is not repeated (it is not idempotent) whose connection
 * failed after it may have reached the dispatcher is a
 * {@link GliaConnectionLostError}.
 */

/**
 * The stable error codes of the API (`dispatcher/src/error.rs`,
 * `ApiError::code`). Codes never change meaning; a newer dispatcher may add
 * codes, hence the open `string` end.
 */
export type ErrorCode =
  | "agent_not_found"
  | "already_answered"
  | "already_decided"
  | "already_paused"
  | "already_posted"
  | "approval_not_found"
  | "batch_ended"
  | "batch_not_found"
  | "body_too_large"
  | "body_unreadable"
  | "call_not_found"
  | "corrupt_record"
  | "dataset_not_found"
  | "experiment_ended"
  | "experiment_not_found"
  | "forbidden"
  | "head_moved"
  | "idempotency_conflict"
  | "internal"
  | "invalid_body"
  | "invalid_header"
  | "invalid_path"
  | "invalid_query"
  | "invalid_request"
  | "invalid_token"
  | "ledger_unavailable"
  | "log_unavailable"
  | "malformed_json"
  | "method_not_allowed"
  | "missing_token"
  | "not_available"
  | "not_awaiting_input"
  | "not_external"
  | "not_paused"
  | "not_ready"
  | "queue_unavailable"
  | "route_not_found"
  | "run_cancelled"
  | "run_finished"
  | "run_leased"
  | "run_not_finished"
  | "run_not_found"
  | "schedule_exists"
  | "schedule_not_found"
  | "screened_input"
  | "stale_args"
  | "unsupported_media_type"
  | "webhook_not_found"
  | (string & {});

/** An error the dispatcher answered (any non-2xx status with the API's error body). */
export class GliaError extends Error {
  /** The stable snake_case code, e.g. `run_not_found`; `http_<status>` when the body was not the API's error body. */
  readonly code: ErrorCode;
  /** The HTTP status, e.g. 404. */
  readonly status: number;
  /** For a refused value (422 `invalid_request`, `invalid_body`) or query parameter (400 `invalid_query`): the field's path from the body's root, e.g. `config.max_turns`. */
  readonly field: string | undefined;
  /** For an error in one line of a JSON Lines upload: the dispatcher's line number, from 1, as on the wire (a batch's line 1 is its spec). */
  readonly line: number | undefined;
  /**
   * For an error in a batch's item (`submitBatch`): the item's index among
   * the items passed, from 1 (`line` - 1); null when the error is not in an
   * item (the spec line, or no line at all).
   */
  readonly item: number | null;
  /** The request, as `METHOD path`. */
  readonly request: string;
  /** The dispatcher's message alone (`message` adds the request, status and code). */
  readonly detail: string;

  constructor(init: {
    code: ErrorCode;
    status: number;
    message: string;
    field?: string | undefined;
    line?: number | undefined;
    item?: number | null | undefined;
    request: string;
  }) {
    const where = init.item != null ? ` (line ${init.line} is item ${init.item})` : "";
    super(`${init.request}: ${init.status} ${init.code}: ${init.message}${where}`);
    this.name = "GliaError";
    this.code = init.code;
    this.status = init.status;
    this.field = init.field;
    this.line = init.line;
    this.item = init.item ?? null;
    this.request = init.request;
    this.detail = init.message;
  }

  /**
   * This error placed in a batch upload whose line 1 is the spec: `item` is
   * `line` - 1 for a line from 2 on, null otherwise.
   */
  inBatch(): GliaError {
    return new GliaError({
      code: this.code,
      status: this.status,
      message: this.detail,
      field: this.field,
      line: this.line,
      item: this.line !== undefined && this.line >= 2 ? this.line - 1 : null,
      request: this.request,
    });
  }

  /**
   * The error of a non-2xx answer: the API's `{"error": {…}}` body when it
   * has one, else `http_<status>` with the body's start as the message.
   */
  static fromBody(status: number, body: unknown, request: string): GliaError {
    const detail =
      typeof body === "object" && body !== null && "error" in body
        ? (body as { error: unknown }).error
        : undefined;
    if (
      typeof detail === "object" &&
      detail !== null &&
      typeof (detail as { code?: unknown }).code === "string"
    ) {
      const d = detail as { code: string; message?: unknown; field?: unknown; line?: unknown };
      return new GliaError({
        code: d.code,
        status,
        message: typeof d.message === "string" ? d.message : "",
        field: typeof d.field === "string" ? d.field : undefined,
        line: typeof d.line === "number" ? d.line : undefined,
        request,
      });
    }
    const text = typeof body === "string" ? body : body === undefined ? "" : JSON.stringify(body);
    return new GliaError({
      code: `http_${status}`,
      status,
      message: text.slice(0, 500) || "(no body)",
      request,
    });
  }
}

/**
 * The dispatcher could not be reached, or kept answering 502/503/504, for
 * longer than the client's `maxOutageMs`. For a request that is not
 * repeated once sent, this means no connection could be made: it did not
 * reach the dispatcher (a connection that failed after it may have is a
 * {@link GliaConnectionLostError}).
 */
export class GliaUnreachableError extends Error {
  /** The dispatcher's base URL. */
  readonly baseUrl: string;
  /** Attempts made. */
  readonly attempts: number;
  /** From the first failure to giving up, in ms. */
  readonly waitedMs: number;
  /** What the last attempt got: a connection error, a timeout, a 503 and its message. */
  readonly last: string;

  constructor(init: { baseUrl: string; attempts: number; waitedMs: number; last: string; cause?: unknown }) {
    super(
      `the dispatcher at ${init.baseUrl} did not answer for ${(init.waitedMs / 1000).toFixed(1)} s (${init.attempts} attempt(s)); last error: ${init.last}`,
      init.cause === undefined ? undefined : { cause: init.cause },
    );
    this.name = "GliaUnreachableError";
    this.baseUrl = init.baseUrl;
    this.attempts = init.attempts;
    this.waitedMs = init.waitedMs;
    this.last = init.last;
  }
}

/**
 * A request that is not repeated through outages (it is not idempotent:
 * pausing or resuming a batch, creating a webhook subscription, a `POST`
 * through `GliaClient.api`) was sent, and its connection failed or
 * timed out before the answer came: it may or may not have taken effect.
 * Check before sending it again. (A connection that could not even be made
 * is retried like any request, since nothing was sent.)
 */
export class GliaConnectionLostError extends Error {
  /** The request, as `METHOD path`. */
  readonly request: string;
  /** What the attempt got: the connection error or the timeout. */
  readonly last: string;

  constructor(init: { request: string; last: string; cause?: unknown }) {
    super(
      `${init.request}: the connection failed before the answer came (${init.last}); the request may have reached the dispatcher and is not repeated, as a repeat would not be harmless: check whether it took effect`,
      init.cause === undefined ? undefined : { cause: init.cause },
    );
    this.name = "GliaConnectionLostError";
    this.request = init.request;
    this.last = init.last;
  }
}

/** A webhook delivery whose signature or timestamp does not verify (see `verifyWebhook`). */
export class WebhookVerificationError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "WebhookVerificationError";
  }
}

/** A wait (`GliaClient.wait`'s `timeoutMs`) ended before the run got where it was awaited. */
export class GliaTimeoutError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "GliaTimeoutError";
  }
}
