/**
 * The glia client: a small layer over the typed fetch client
 * (`openapi-fetch` keyed by the generated `paths` of `schemas/openapi.json`)
 * that adds idempotent submits, retries through outages, resumable event
 * streams, waits, and typed errors.
 */

import createClient, { type Client } from "openapi-fetch";

import { GliaError, GliaTimeoutError, GliaUnreachableError, type GliaConnectionLostError } from "./errors.js";
import {
  DEFAULT_RETRY,
  backoffMs,
  describe,
  sendWithRetries,
  sleep,
  type RetryOptions,
  type RetryPolicy,
} from "./retry.js";
import { readJsonLines, readSse } from "./sse.js";
import type { components, paths } from "./generated/openapi.js";

type Schemas = components["schemas"];

/** A run as every run endpoint answers it (`RunSummary`; `docs/runs.md`). */
export type Run = Schemas["RunSummary"];
/** One page of `GET /v1/runs`: `runs`, newest first, and `next_cursor`. */
export type RunPage = Schemas["RunPage"];
/** The body of `POST /v1/runs`: `goal`, and `config` or `agent`, `tags`, `metadata`, … */
export type CreateRun = Schemas["CreateRun"];
/** A run configuration (`RunConfig`: model, tools, policies, budgets, …). */
export type RunConfig = Schemas["RunConfig"];
/** The filters of `GET /v1/runs` (`docs/runs.md`, "The listing"). */
export type ListRunsQuery = NonNullable<paths["/v1/runs"]["get"]["parameters"]["query"]>;
/** One persisted event of a run's log: `run_id`, `seq` (1, 2, 3 … with no gaps), `at`, `type` (`session.start`, `tool.call`, …) and `data`. */
export type Event = Schemas["Event"];
/** One page of `GET /v1/runs/{id}/events`. */
export type EventPage = Schemas["EventPage"];
/** A live delta of a stream (`model.delta`, `model.discard`, `tool.progress`): never persisted, best effort. */
export type LiveEvent = Schemas["LiveEvent"];
/** What a payload endpoint answers (202): the inbox ids and kinds posted. */
export type Accepted = Schemas["Accepted"];
/**
 * A decision on one approval (`DecisionBody` of the document): `approve`,
 * `reject` (the model sees `reason`) or `edit` (replacement arguments
 * `input`, a JSON object), optionally quoting the `args_hash` the person saw.
 * Written out here because the document's form (`input: null` for approve
 * and reject) does not survive openapi-fetch's request typing; every call
 * that sends it is checked against the document's type.
 */
export type DecisionBody =
  | { decision: "approve"; reason?: string; args_hash?: string }
  | { decision: "reject"; reason?: string; args_hash?: string }
  | { decision: "edit"; input: Record<string, unknown>; reason?: string; args_hash?: string };
/** One decision of a bulk request: a {@link DecisionBody} with its `run_id` and `call_id`. */
export type BulkDecision = DecisionBody & { run_id: string; call_id: string };
/** The answer of `POST /v1/approvals`: one result per decision, in order. */
export type BulkResults = Schemas["BulkResults"];
/** One row of the approval queue. */
export type ApprovalRow = Schemas["ApprovalRow"];
/** The approval queue, oldest first. */
export type ApprovalPage = Schemas["ApprovalPage"];
/** The filters of `GET /v1/approvals`. */
export type ApprovalsQuery = NonNullable<paths["/v1/approvals"]["get"]["parameters"]["query"]>;
/** The body of an external tool's result: `content` (text the model sees) and `is_error`. */
export type ToolResultBody = Schemas["ToolResultBody"];
/** Line 1 of a JSON Lines batch: `config` or `agent`, and `options`. */
export type BatchSpec = Schemas["BatchSpec"];
/** One item of a batch: `custom_id`, `goal`, `inputs`, `metadata`, `tags`, `config` (a merge patch). */
export type BatchItem = Schemas["BatchItem"];
/** A batch with its counts, spend and status. */
export type BatchView = Schemas["BatchView"];
/** One line of a batch's results. */
export type ItemResult = Schemas["ItemResult"];
/** An agent definition (`PUT /v1/agents/{name}`). */
export type AgentDefinition = Schemas["AgentDefinition"];
/** One registered version of an agent. */
export type AgentBody = Schemas["AgentBody"];
/** A new webhook subscription: `url`, `events`, `format`. */
export type NewSubscription = Schemas["NewSubscription"];
/** A created subscription with its signing `secret` (shown once). */
export type CreatedSubscription = Schemas["Created"];

/**
 * What a payload endpoint answered, or, when `repeated` is true, that a
 * retry after an attempt whose answer was lost was refused because the
 * payload had already landed, as the run's log shows: a decision's
 * `approval.resolved` with the same decision (and, for an edit, the same
 * input; for a reject, the same reason), an external result's `tool.result`
 * (or `tool.error` for `is_error`) with the same content, a message's
 * `input.received` with the same text as the next input after its
 * `head_seq`, a cancel's `session.cancel`. A refusal the log does not show
 * to be this payload's (another person's decision or message, a run that
 * finished without it) is thrown as its {@link GliaError}. The earlier
 * attempt's inbox ids are not known (`inbox_ids` and `kinds` are empty).
 */
export type Posted = Accepted & { repeated?: boolean };

/** Pull points a caller answers; {@link GliaClient.wait} returns at these by default. */
export const ANSWERABLE_PULL_POINTS: readonly string[] = [
  "awaiting_approval",
  "awaiting_tool",
  "awaiting_input",
  "awaiting_event",
  "paused",
];

/** Methods whose repeat is harmless, retried through outages by {@link GliaClient.api}. */
const SAFE_METHODS = new Set(["GET", "HEAD", "OPTIONS"]);

/** Options of a {@link GliaClient}. */
export interface GliaClientOptions extends RetryOptions {
  /** The dispatcher's base URL, e.g. `http://127.0.0.1:8080`. */
  baseUrl: string;
  /** A bearer token (`GLIA_TOKENS` on the dispatcher). */
  token?: string;
  /** The fetch to use (default `globalThis.fetch`). */
  fetch?: (request: Request) => Promise<Response>;
  /** Extra headers for every request. */
  headers?: Record<string, string>;
  /** An event stream that sends nothing (not even its 15 s keep-alive) for this long is reconnected, ms (default 45,000). */
  streamIdleMs?: number;
  /**
   * A stream connection that stayed open this long before it broke shows
   * the dispatcher answering: the outage count starts again, even when no
   * event came (a run parked for hours behind a gateway that cuts long
   * answers), ms (default 15,000, the dispatcher's keep-alive period).
   */
  streamHealthyMs?: number;
}

/** The caller's cancellation of one call. */
export interface CallOptions {
  /** Abort the call (and its retries). */
  signal?: AbortSignal;
}

/** Options of {@link GliaClient.streamEvents}. */
export interface StreamOptions extends CallOptions {
  /** Start after this seq (default 0: from the run's first event). */
  after?: number;
  /** Called with each live delta (`model.delta`, `tool.progress`, …); they are best effort and never resumed. */
  onLive?: (event: LiveEvent) => void;
  /** Called before each reconnection with the seq it resumes after (sent as `Last-Event-ID`) and why. */
  onReconnect?: (lastEventId: number, reason: string) => void;
}

/** Options of {@link GliaClient.wait}. */
export interface WaitOptions extends CallOptions {
  /** Pull points to return at (default {@link ANSWERABLE_PULL_POINTS}); a run that is done always returns. */
  pullPoints?: readonly string[];
  /** Give up after this many ms with {@link GliaTimeoutError} (default: wait as long as it takes). */
  timeoutMs?: number;
  /**
   * Return a parked run only once its log has moved past this seq: pass the
   * `head_seq` of the parked run you just answered, since a posted decision
   * (or result, or message) leaves the run parked where it was until a
   * worker takes it up. A run that is done always returns.
   */
  afterSeq?: number;
}

/** The request's `METHOD path`, for errors. */
type Label = string;

const TERMINAL = new Set(["session.complete", "session.cancel"]);

/** Refusals of a retried tool result that its earlier attempt may have caused (see {@link GliaClient.postToolResult}). */
const TOOL_RESULT_LANDED_CODES = new Set(["already_answered", "call_not_found", "run_finished"]);

/** Refusals of a retried message that its earlier attempt may have caused (see {@link GliaClient.postMessage}). */
const MESSAGE_LANDED_CODES = new Set(["already_posted", "head_moved", "not_awaiting_input", "run_finished"]);

/** `value` as JSON with object keys sorted, so equal values compare equal whatever their key order. */
function canonical(value: unknown): string {
  if (Array.isArray(value)) {
    return `[${value.map(canonical).join(",")}]`;
  }
  if (value !== null && typeof value === "object") {
    const entries = Object.entries(value as Record<string, unknown>)
      .filter(([, v]) => v !== undefined)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${canonical(v)}`).join(",")}}`;
  }
  return JSON.stringify(value) ?? "null";
}

/**
 * Whether a logged decision (`approval.resolved`'s `decision`: `{kind,
 * reason?, input?}`) is `body`: the same kind; for an edit the same input;
 * for a reject with a reason, the same reason.
 */
function sameDecision(logged: unknown, body: DecisionBody): boolean {
  const d = (logged ?? {}) as { kind?: unknown; reason?: unknown; input?: unknown };
  if (d.kind !== body.decision) {
    return false;
  }
  if (body.decision === "edit") {
    return canonical(d.input) === canonical(body.input);
  }
  if (body.decision === "reject" && body.reason !== undefined) {
    return d.reason === body.reason;
  }
  return true;
}

/**
 * A client of one dispatcher.
 *
 * Every method throws {@link GliaError} (with the API's `code`, `status`,
 * `message`, `field`) when the dispatcher refuses, and
 * {@link GliaUnreachableError} when it cannot be reached within
 * `maxOutageMs`. Reads, submits with an `Idempotency-Key`, decisions, tool
 * results, messages (bound to the run's `head_seq`), cancels and agent
 * registrations are retried through outages (a retried payload's refusal is
 * checked against the run's log, see {@link Posted}). Anything else is
 * retried only while its connection cannot be made; once it may have been
 * sent, a failed connection is a {@link GliaConnectionLostError}.
 */
export class GliaClient {
  /** The typed fetch client over the whole document, for endpoints this class does not wrap (schedules, datasets, experiments, …). */
  readonly api: Client<paths>;
  readonly #baseUrl: string;
  readonly #policy: RetryPolicy;
  readonly #fetch: (request: Request) => Promise<Response>;
  readonly #streamIdleMs: number;
  readonly #streamHealthyMs: number;

  constructor(options: GliaClientOptions) {
    this.#baseUrl = options.baseUrl.replace(/\/+$/, "");
    this.#policy = {
      maxOutageMs: options.maxOutageMs ?? DEFAULT_RETRY.maxOutageMs,
      minDelayMs: options.minDelayMs ?? DEFAULT_RETRY.minDelayMs,
      maxDelayMs: options.maxDelayMs ?? DEFAULT_RETRY.maxDelayMs,
      attemptTimeoutMs: options.attemptTimeoutMs ?? DEFAULT_RETRY.attemptTimeoutMs,
    };
    this.#fetch = options.fetch ?? ((request: Request) => globalThis.fetch(request));
    this.#streamIdleMs = options.streamIdleMs ?? 45_000;
    this.#streamHealthyMs = options.streamHealthyMs ?? 15_000;
    this.api = createClient<paths>({
      baseUrl: this.#baseUrl,
      headers: {
        ...(options.token !== undefined ? { Authorization: `Bearer ${options.token}` } : {}),
        ...options.headers,
      },
      // Reads are retried through outages; anything else only while its connection cannot be made.
      fetch: (request: Request) => this.#sender({ retry: SAFE_METHODS.has(request.method), buffer: true })(request),
    });
  }

  /** A fetch for openapi-fetch that sends through {@link sendWithRetries}. */
  #sender(options: {
    retry: boolean;
    buffer: boolean;
    signal?: AbortSignal | undefined;
    attempts?: { count: number };
  }): (request: Request) => Promise<Response> {
    return (request: Request) =>
      sendWithRetries(this.#fetch, request, this.#policy, this.#baseUrl, {
        retry: options.retry,
        buffer: options.buffer,
        signal: options.signal,
        onAttempt: (n) => {
          if (options.attempts) {
            options.attempts.count = n;
          }
        },
      });
  }

  /** The data of an answer, or its {@link GliaError}. */
  async #unwrap<D>(label: Label, call: Promise<{ data?: D; error?: unknown; response: Response }>): Promise<D> {
    const { data, error, response } = await call;
    if (!response.ok) {
      throw GliaError.fromBody(response.status, error, label);
    }
    return data as D;
  }

  /**
   * A payload post retried through outages. After a retry (an earlier
   * attempt may have landed with its answer lost), a refusal that `landed`
   * finds this payload's effect for in the run's log is a {@link Posted}
   * with `repeated`; any other refusal, and every refusal without a retry,
   * is its {@link GliaError}.
   */
  async #post(
    label: Label,
    runId: string,
    callId: string | undefined,
    send: (fetch: (request: Request) => Promise<Response>) => Promise<{ data?: Accepted; error?: unknown; response: Response }>,
    signal: AbortSignal | undefined,
    landed: (e: GliaError) => boolean | Promise<boolean>,
  ): Promise<Posted> {
    const attempts = { count: 0 };
    try {
      return await this.#unwrap(label, send(this.#sender({ retry: true, buffer: true, signal, attempts })));
    } catch (e) {
      if (e instanceof GliaError && attempts.count > 1) {
        let shown = false;
        try {
          shown = await landed(e);
        } catch {
          if (signal?.aborted) {
            throw signal.reason;
          }
          // The log could not be read: not shown to be this payload's, so the refusal stands.
        }
        if (shown) {
          return { run_id: runId, call_id: callId ?? null, inbox_ids: [], kinds: [], repeated: true };
        }
      }
      throw e;
    }
  }

  /**
   * Whether the run's log after `after` shows a payload's effect: the first
   * event `verdict` decides for (true: this payload's, false: another's)
   * decides. With `follow` the log is followed as it grows (the payload may
   * still wait in the run's inbox) until the run ends, or for at most
   * `maxOutageMs` (then false: not shown); without, only what is written
   * now is read. Not shown, not landed: the caller's refusal stands.
   */
  async #logShows(
    runId: string,
    after: number,
    follow: boolean,
    verdict: (event: Event) => boolean | undefined,
    signal: AbortSignal | undefined,
  ): Promise<boolean> {
    if (!follow) {
      let from = after;
      for (;;) {
        const page = await this.listEvents(runId, { after: from, limit: 1000 }, { signal });
        for (const event of page.events) {
          const v = verdict(event);
          if (v !== undefined) {
            return v;
          }
        }
        if (page.events.length === 0 || page.next_after <= from) {
          return false;
        }
        from = page.next_after;
      }
    }
    const deadline = AbortSignal.timeout(Math.max(this.#policy.maxOutageMs, 1_000));
    const bounded = signal ? AbortSignal.any([signal, deadline]) : deadline;
    try {
      for await (const event of this.streamEvents(runId, { after, signal: bounded })) {
        const v = verdict(event);
        if (v !== undefined) {
          return v;
        }
      }
      return false;
    } catch (e) {
      if (deadline.aborted && !signal?.aborted) {
        return false;
      }
      throw e;
    }
  }

  // ----- runs ----------------------------------------------------------------------------

  /**
   * Submit a run (`POST /v1/runs`). Sends an `Idempotency-Key` (the given
   * one, else a new UUID) and reuses it on every retry, so a retry after a
   * lost answer finds the run the first attempt created instead of making
   * another. 409 `idempotency_conflict` when the key was used for a
   * different goal, config or batch.
   */
  async submitRun(body: CreateRun, options: CallOptions & { idempotencyKey?: string } = {}): Promise<Run> {
    const key = options.idempotencyKey ?? crypto.randomUUID();
    return this.#unwrap(
      "POST /v1/runs",
      this.api.POST("/v1/runs", {
        params: { header: { "Idempotency-Key": key } },
        body,
        fetch: this.#sender({ retry: true, buffer: true, signal: options.signal }),
      }),
    );
  }

  /** One run (`GET /v1/runs/{id}`); 404 `run_not_found` for a run the token's tenant does not own. */
  async getRun(runId: string, options: CallOptions = {}): Promise<Run> {
    return this.#unwrap(
      `GET /v1/runs/${runId}`,
      this.api.GET("/v1/runs/{id}", {
        params: { path: { id: runId } },
        fetch: this.#sender({ retry: true, buffer: true, signal: options.signal }),
      }),
    );
  }

  /** One page of runs, newest first (`GET /v1/runs`); pass `next_cursor` as `cursor` with the same filters for the next. */
  async listRuns(query: ListRunsQuery = {}, options: CallOptions = {}): Promise<RunPage> {
    return this.#unwrap(
      "GET /v1/runs",
      this.api.GET("/v1/runs", {
        params: { query },
        fetch: this.#sender({ retry: true, buffer: true, signal: options.signal }),
      }),
    );
  }

  /** Every run matching `query`, newest first, following the cursors page by page. */
  async *runs(query: ListRunsQuery = {}, options: CallOptions = {}): AsyncGenerator<Run, void, undefined> {
    let cursor = query.cursor;
    for (;;) {
      const page = await this.listRuns({ ...query, ...(cursor !== undefined ? { cursor } : {}) }, options);
      yield* page.runs;
      if (page.next_cursor === null || page.next_cursor === undefined) {
        return;
      }
      cursor = page.next_cursor;
    }
  }

  /** One page of a run's events with `seq > after` (`GET /v1/runs/{id}/events`). */
  async listEvents(runId: string, query: { after?: number; limit?: number } = {}, options: CallOptions = {}): Promise<EventPage> {
    return this.#unwrap(
      `GET /v1/runs/${runId}/events`,
      this.api.GET("/v1/runs/{id}/events", {
        params: { path: { id: runId }, query },
        fetch: this.#sender({ retry: true, buffer: true, signal: options.signal }),
      }),
    );
  }

  /**
   * A run's events as they are written (`GET /v1/runs/{id}/events/stream`,
   * server-sent events), from `after` to the run's end (`session.complete`
   * or `session.cancel`, the last event yielded).
   *
   * When the connection breaks, goes idle (no keep-alive within
   * `streamIdleMs`) or ends early, the stream reconnects with
   * `Last-Event-ID` = the last seq yielded: every event is yielded exactly
   * once, in order. Reconnections that bring no event count as an outage
   * (backoff; {@link GliaUnreachableError} after `maxOutageMs`). Stop early
   * with `break` or the signal.
   */
  async *streamEvents(runId: string, options: StreamOptions = {}): AsyncGenerator<Event, void, undefined> {
    let last = options.after ?? 0;
    if (last > 0) {
      // A stream that starts after a finished run's last event would wait forever.
      const run = await this.getRun(runId, options);
      if (run.status === "done" && run.head_seq <= last) {
        return;
      }
    }
    const onLive = options.onLive;
    yield* this.#resumable<Event>({
      label: `GET /v1/runs/${runId}/events/stream`,
      signal: options.signal,
      open: (fetch, signal) =>
        this.api.GET("/v1/runs/{id}/events/stream", {
          params: { path: { id: runId }, ...(last > 0 ? { header: { "Last-Event-ID": last } } : {}) },
          parseAs: "stream",
          signal,
          fetch,
        }),
      async *read(body, idle) {
        for await (const frame of readSse(body, idle.ms, idle.abort)) {
          if (frame.event === "event") {
            const event = JSON.parse(frame.data) as Event;
            if (event.seq <= last) {
              continue;
            }
            last = event.seq;
            yield event;
            if (TERMINAL.has(event.type)) {
              return true;
            }
          } else if (frame.event === "live") {
            onLive?.(JSON.parse(frame.data) as LiveEvent);
          } else if (frame.event === "error") {
            // The dispatcher gave up reading the log (a store outage): an outage to wait out.
            return `the dispatcher's stream failed: ${frame.data}`;
          }
        }
        return "the stream ended before the run did";
      },
      onReconnect: (reason) => options.onReconnect?.(last, reason),
    });
  }

  /**
   * Wait until the run parks at one of `pullPoints` (default: one a caller
   * answers, {@link ANSWERABLE_PULL_POINTS}) or is done, and return it.
   * After answering a parked run, pass its `head_seq` as `afterSeq`: until a
   * worker takes the answer up the run still shows the pull point answered.
   * Follows the run's event stream and reads the run after each event (and
   * every 2 s while nothing comes); when the stream fails (a gateway that
   * refuses streams) it goes on reading the run every 2 s, so only a
   * dispatcher that does not answer those reads ends the wait early.
   */
  async wait(runId: string, options: WaitOptions = {}): Promise<Run> {
    const wanted = options.pullPoints ?? ANSWERABLE_PULL_POINTS;
    const settled = (run: Run) =>
      run.status === "done" ||
      (run.status === "parked" &&
        run.pull_point != null &&
        wanted.includes(run.pull_point.kind) &&
        (options.afterSeq === undefined || run.head_seq > options.afterSeq));
    const local = new AbortController();
    const signals = [local.signal];
    if (options.signal) {
      signals.push(options.signal);
    }
    const deadline = options.timeoutMs !== undefined ? AbortSignal.timeout(options.timeoutMs) : undefined;
    if (deadline) {
      signals.push(deadline);
    }
    const signal = AbortSignal.any(signals);
    let events: AsyncGenerator<Event, void, undefined> | undefined;
    try {
      let run = await this.getRun(runId, { signal });
      if (settled(run)) {
        return run;
      }
      const stream = this.streamEvents(runId, { after: run.head_seq, signal });
      events = stream;
      // Every pending read is handled, so one left behind when this returns
      // rejects quietly; a stream that fails ends, and the reads every 2 s go on.
      const advance = (): Promise<{ done: boolean }> =>
        stream.next().then(
          (result) => ({ done: result.done === true }),
          () => ({ done: true }),
        );
      const never = new Promise<never>(() => undefined);
      let next: Promise<{ done: boolean }> = advance();
      for (;;) {
        let timer: ReturnType<typeof setTimeout> | undefined;
        const tick = new Promise<"tick">((resolve) => {
          timer = setTimeout(() => resolve("tick"), 2_000);
        });
        const which = await Promise.race([next, tick]).finally(() => clearTimeout(timer));
        if (which !== "tick") {
          next = which.done ? never : advance();
        }
        run = await this.getRun(runId, { signal });
        if (settled(run)) {
          return run;
        }
      }
    } catch (e) {
      if (deadline?.aborted && !options.signal?.aborted) {
        throw new GliaTimeoutError(`run ${runId} reached neither a pull point (${wanted.join(", ")}) nor its end within ${options.timeoutMs} ms`);
      }
      throw e;
    } finally {
      local.abort();
      events?.return(undefined).catch(() => undefined);
    }
  }

  // ----- approvals -----------------------------------------------------------------------

  /** The approval queue, oldest first (`GET /v1/approvals`; scope `approve`). */
  async listApprovals(query: ApprovalsQuery = {}, options: CallOptions = {}): Promise<ApprovalPage> {
    return this.#unwrap(
      "GET /v1/approvals",
      this.api.GET("/v1/approvals", {
        params: { query },
        fetch: this.#sender({ retry: true, buffer: true, signal: options.signal }),
      }),
    );
  }

  /**
   * Decide one approval (`POST /v1/runs/{id}/approvals/{call_id}`). The
   * first decision wins: another one answers 409 `already_decided`; with
   * `args_hash` quoted, a call whose arguments changed answers 409
   * `stale_args`. Retried through outages (see {@link Posted}).
   */
  async decide(runId: string, callId: string, body: DecisionBody, options: CallOptions = {}): Promise<Posted> {
    return this.#post(
      `POST /v1/runs/${runId}/approvals/${callId}`,
      runId,
      callId,
      (fetch) =>
        this.api.POST("/v1/runs/{id}/approvals/{call_id}", {
          params: { path: { id: runId, call_id: callId } },
          body,
          fetch,
        }),
      options.signal,
      // The call is decided or the run done: landed only if the decision in the log is this one.
      (e) =>
        (e.code === "already_decided" || e.code === "run_finished") &&
        this.#logShows(
          runId,
          0,
          e.code === "already_decided",
          (event) => {
            const data = event.data as { call_id?: unknown; decision?: unknown };
            return event.type === "approval.resolved" && data.call_id === callId ? sameDecision(data.decision, body) : undefined;
          },
          options.signal,
        ),
    );
  }

  /** Approve a call as proposed. */
  approve(runId: string, callId: string, options: CallOptions & { argsHash?: string } = {}): Promise<Posted> {
    return this.decide(runId, callId, { decision: "approve", ...(options.argsHash ? { args_hash: options.argsHash } : {}) }, options);
  }

  /** Reject a call; the model sees `reason`. */
  reject(runId: string, callId: string, reason: string, options: CallOptions & { argsHash?: string } = {}): Promise<Posted> {
    return this.decide(
      runId,
      callId,
      { decision: "reject", reason, ...(options.argsHash ? { args_hash: options.argsHash } : {}) },
      options,
    );
  }

  /** Approve a call with replacement arguments (`input`, a JSON object checked against the tool's schema). */
  edit(
    runId: string,
    callId: string,
    input: Record<string, unknown>,
    options: CallOptions & { argsHash?: string } = {},
  ): Promise<Posted> {
    return this.decide(
      runId,
      callId,
      { decision: "edit", input, ...(options.argsHash ? { args_hash: options.argsHash } : {}) },
      options,
    );
  }

  /**
   * Decide many approvals at once (`POST /v1/approvals`, at most 100): each
   * result carries what the single endpoint would have answered. Retried
   * through outages; after a retry an item's 409 `already_decided` may be
   * its own earlier attempt.
   */
  async decideMany(decisions: BulkDecision[], options: CallOptions = {}): Promise<BulkResults> {
    return this.#unwrap(
      "POST /v1/approvals",
      this.api.POST("/v1/approvals", {
        body: { decisions },
        fetch: this.#sender({ retry: true, buffer: true, signal: options.signal }),
      }),
    );
  }

  // ----- payloads ------------------------------------------------------------------------

  /** Post an external tool call's result (`POST /v1/runs/{id}/tool-results/{call_id}`); the first result wins (409 `already_answered`). */
  async postToolResult(runId: string, callId: string, body: ToolResultBody, options: CallOptions = {}): Promise<Posted> {
    return this.#post(
      `POST /v1/runs/${runId}/tool-results/${callId}`,
      runId,
      callId,
      (fetch) =>
        this.api.POST("/v1/runs/{id}/tool-results/{call_id}", {
          params: { path: { id: runId, call_id: callId } },
          body,
          fetch,
        }),
      options.signal,
      // The call is answered (the result may wait in the inbox), no longer pending (the run
      // went on) or the run is done: landed only if the result in the log is this one.
      (e) =>
        TOOL_RESULT_LANDED_CODES.has(e.code) &&
        this.#logShows(
          runId,
          0,
          e.code === "already_answered",
          (event) => {
            const data = event.data as { call_id?: unknown; content?: unknown; message?: unknown };
            if (data.call_id !== callId) {
              return undefined;
            }
            if (event.type === "tool.result") {
              return body.is_error !== true && data.content === body.content;
            }
            if (event.type === "tool.error") {
              return body.is_error === true && data.message === body.content;
            }
            return undefined;
          },
          options.signal,
        ),
    );
  }

  /**
   * Post the user's next message to a run waiting at `awaiting_input`
   * (`POST /v1/runs/{id}/messages`). The message is bound to the run's
   * `head_seq` (the given one, else read now), so a retry is never taken
   * as a second message: 409 `head_moved` when the run moved on. After a
   * retry, a refusal is `{repeated: true}` only when the run's next input
   * after `head_seq` is this text (see {@link Posted}).
   */
  async postMessage(runId: string, text: string, options: CallOptions & { headSeq?: number } = {}): Promise<Posted> {
    const headSeq = options.headSeq ?? (await this.getRun(runId, options)).head_seq;
    return this.#post(
      `POST /v1/runs/${runId}/messages`,
      runId,
      undefined,
      (fetch) =>
        this.api.POST("/v1/runs/{id}/messages", {
          params: { path: { id: runId } },
          body: { text, head_seq: headSeq },
          fetch,
        }),
      options.signal,
      // Landed only if the run's next input after headSeq is this text. A
      // message waiting in the inbox (already_posted) may be another's: follow
      // the log until a worker takes it. Otherwise (head_moved,
      // not_awaiting_input, run_finished) a message taken is in the log now.
      (e) =>
        MESSAGE_LANDED_CODES.has(e.code) &&
        this.#logShows(
          runId,
          headSeq,
          e.code === "already_posted",
          (event) => {
            if (event.type === "input.received") {
              return (event.data as { text?: unknown }).text === text;
            }
            return TERMINAL.has(event.type) ? false : undefined;
          },
          options.signal,
        ),
    );
  }

  /**
   * Cancel a run (`POST /v1/runs/{id}/cancel`): its model stream stops at
   * once, running tool calls get their grace period. A second cancel
   * answers the first's inbox id; a run already done is 409 `run_finished`.
   */
  async cancel(runId: string, options: CallOptions & { reason?: string } = {}): Promise<Posted> {
    return this.#post(
      `POST /v1/runs/${runId}/cancel`,
      runId,
      undefined,
      (fetch) =>
        this.api.POST("/v1/runs/{id}/cancel", {
          params: { path: { id: runId } },
          body: options.reason !== undefined ? { reason: options.reason } : {},
          fetch,
        }),
      options.signal,
      // The run is done: landed if it was cancelled (a cancel answers the first cancel's; any counts).
      async (e) => e.code === "run_finished" && (await this.getRun(runId, options)).outcome?.kind === "cancelled",
    );
  }

  // ----- batches -------------------------------------------------------------------------

  /**
   * Submit a batch as JSON Lines (`POST /v1/batches`): line 1 the `spec`,
   * then one line per item. Stored whole or not at all: a bad line refuses
   * the batch with a {@link GliaError} carrying `field`, `line` (the
   * dispatcher's line: 1 is the spec) and `item` (the index of the bad item
   * in `items`, from 1; null when the spec is at fault). Sends an
   * `Idempotency-Key` (given or a new UUID), reused on retries.
   */
  async submitBatch(
    spec: BatchSpec,
    items: Iterable<BatchItem> | AsyncIterable<BatchItem>,
    options: CallOptions & { idempotencyKey?: string } = {},
  ): Promise<BatchView> {
    const lines = [JSON.stringify(spec)];
    for await (const item of items) {
      lines.push(JSON.stringify(item));
    }
    const key = options.idempotencyKey ?? crypto.randomUUID();
    try {
      return await this.#unwrap(
        "POST /v1/batches",
        this.api.POST("/v1/batches", {
          params: { header: { "Idempotency-Key": key } },
          body: `${lines.join("\n")}\n`,
          bodySerializer: (body: unknown) => body,
          headers: { "Content-Type": "application/jsonl" },
          fetch: this.#sender({ retry: true, buffer: true, signal: options.signal }),
        }),
      );
    } catch (e) {
      throw e instanceof GliaError && e.line !== undefined ? e.inBatch() : e;
    }
  }

  /** A batch with its counts, spend and status (`GET /v1/batches/{id}`). */
  async getBatch(batchId: string, options: CallOptions = {}): Promise<BatchView> {
    return this.#unwrap(
      `GET /v1/batches/${batchId}`,
      this.api.GET("/v1/batches/{id}", {
        params: { path: { id: batchId } },
        fetch: this.#sender({ retry: true, buffer: true, signal: options.signal }),
      }),
    );
  }

  /**
   * A batch's progress (`GET /v1/batches/{id}/stream`): its view now and
   * whenever it changes, until nothing is left to run. Reconnects when the
   * connection breaks (the first view after it is the current one).
   */
  async *batchProgress(batchId: string, options: CallOptions = {}): AsyncGenerator<BatchView, void, undefined> {
    let previous: string | undefined;
    yield* this.#resumable<BatchView>({
      label: `GET /v1/batches/${batchId}/stream`,
      signal: options.signal,
      open: (fetch, signal) =>
        this.api.GET("/v1/batches/{id}/stream", { params: { path: { id: batchId } }, parseAs: "stream", signal, fetch }),
      async *read(body, idle) {
        for await (const frame of readSse(body, idle.ms, idle.abort)) {
          if (frame.event === "progress" && frame.data !== previous) {
            previous = frame.data;
            yield JSON.parse(frame.data) as BatchView;
          }
        }
        // The dispatcher ends the stream after a view with nothing left to run.
        const view = previous === undefined ? undefined : (JSON.parse(previous) as BatchView);
        const open = view
          ? view.counts.queued + view.counts.running + Object.values(view.counts.parked ?? {}).reduce((a, b) => a + b, 0)
          : 1;
        return open === 0 ? true : "the stream ended before the batch did";
      },
    });
  }

  /**
   * Every item's result, in submission order (`GET /v1/batches/{id}/results`,
   * JSON Lines read as it arrives); items not finished show their status. A
   * connection that breaks is read again from the start, skipping the items
   * already yielded.
   */
  async *batchResults(batchId: string, options: CallOptions = {}): AsyncGenerator<ItemResult, void, undefined> {
    let yielded = 0;
    yield* this.#resumable<ItemResult>({
      label: `GET /v1/batches/${batchId}/results`,
      signal: options.signal,
      open: (fetch, signal) =>
        this.api.GET("/v1/batches/{id}/results", { params: { path: { id: batchId } }, parseAs: "stream", signal, fetch }),
      async *read(body) {
        let index = 0;
        for await (const line of readJsonLines(body)) {
          if (index++ >= yielded) {
            yielded++;
            yield line as ItemResult;
          }
        }
        return true;
      },
    });
  }

  /**
   * The values `read` takes from a streamed answer of `open`, reconnecting
   * when the connection breaks, goes idle or ends early (`read` returns the
   * reason) until `read` returns true. Connections that bring no value and
   * broke before `streamHealthyMs` count as an outage: backoff, then
   * {@link GliaUnreachableError} after `maxOutageMs`. One that stayed open
   * that long (keep-alives only: a parked run behind a gateway that cuts
   * long answers) shows the dispatcher answering, and the outage count
   * starts again. A refusal is its {@link GliaError}.
   */
  async *#resumable<T>(stream: {
    label: Label;
    signal: AbortSignal | undefined;
    open: (
      fetch: (request: Request) => Promise<Response>,
      signal: AbortSignal,
    ) => Promise<{ data?: ReadableStream<Uint8Array> | null; error?: unknown; response: Response }>;
    read: (
      body: ReadableStream<Uint8Array>,
      idle: { ms: number; abort: () => void },
    ) => AsyncGenerator<T, true | string, undefined>;
    onReconnect?: (reason: string) => void;
  }): AsyncGenerator<T, void, undefined> {
    let outageStart: number | undefined;
    let failures = 0;
    for (;;) {
      const connection = new AbortController();
      const signal = stream.signal ? AbortSignal.any([stream.signal, connection.signal]) : connection.signal;
      let progressed = false;
      let openedAt: number | undefined;
      let reason: string;
      let values: AsyncGenerator<T, true | string, undefined> | undefined;
      try {
        const { data: body, error, response } = await stream.open(
          this.#sender({ retry: true, buffer: false, signal: stream.signal }),
          signal,
        );
        if (!response.ok || !body) {
          throw GliaError.fromBody(response.status, error, stream.label);
        }
        openedAt = Date.now();
        const idleMs = this.#streamIdleMs;
        values = stream.read(body, {
          ms: idleMs,
          abort: () => connection.abort(new Error(`the stream sent nothing for ${idleMs} ms`)),
        });
        for (;;) {
          const next = await values.next();
          if (next.done) {
            if (next.value === true) {
              return;
            }
            reason = next.value;
            break;
          }
          progressed = true;
          outageStart = undefined;
          failures = 0;
          yield next.value;
        }
      } catch (e) {
        if (stream.signal?.aborted) {
          throw stream.signal.reason;
        }
        if (e instanceof GliaError || e instanceof GliaUnreachableError || e instanceof SyntaxError) {
          throw e;
        }
        reason = connection.signal.aborted ? describe(connection.signal.reason) : describe(e);
      } finally {
        connection.abort();
        values?.return(true).catch(() => undefined);
      }
      if (!progressed && openedAt !== undefined && Date.now() - openedAt >= this.#streamHealthyMs) {
        // Open long enough to show the dispatcher answers: not an outage, reconnect at once.
        progressed = true;
        outageStart = undefined;
        failures = 0;
      }
      if (!progressed) {
        const now = Date.now();
        outageStart ??= now;
        failures++;
        if (now - outageStart >= this.#policy.maxOutageMs) {
          throw new GliaUnreachableError({ baseUrl: this.#baseUrl, attempts: failures, waitedMs: now - outageStart, last: reason });
        }
        await sleep(backoffMs(this.#policy, failures), stream.signal);
      }
      stream.onReconnect?.(reason);
    }
  }

  /** Cancel a batch (`POST /v1/batches/{id}/cancel`): nothing more starts, runs not done are cancelled. Final; retried through outages. */
  async cancelBatch(batchId: string, options: CallOptions = {}): Promise<BatchView> {
    return this.#unwrap(
      `POST /v1/batches/${batchId}/cancel`,
      this.api.POST("/v1/batches/{id}/cancel", {
        params: { path: { id: batchId } },
        fetch: this.#sender({ retry: true, buffer: true, signal: options.signal }),
      }),
    );
  }

  /** Pause a batch (`POST /v1/batches/{id}/pause`): no item starts, its runs pause at their next step. 409 `batch_ended` once ended. */
  async pauseBatch(batchId: string, options: CallOptions = {}): Promise<BatchView> {
    return this.#unwrap(
      `POST /v1/batches/${batchId}/pause`,
      this.api.POST("/v1/batches/{id}/pause", {
        params: { path: { id: batchId } },
        fetch: this.#sender({ retry: false, buffer: true, signal: options.signal }),
      }),
    );
  }

  /** Resume a batch (`POST /v1/batches/{id}/resume`), optionally replacing its spend cap. */
  async resumeBatch(
    batchId: string,
    options: CallOptions & { spendCap?: Schemas["SpendCapBody"] } = {},
  ): Promise<BatchView> {
    return this.#unwrap(
      `POST /v1/batches/${batchId}/resume`,
      this.api.POST("/v1/batches/{id}/resume", {
        params: { path: { id: batchId } },
        body: options.spendCap !== undefined ? { spend_cap: options.spendCap } : {},
        fetch: this.#sender({ retry: false, buffer: true, signal: options.signal }),
      }),
    );
  }

  // ----- agents --------------------------------------------------------------------------

  /**
   * Register an agent definition (`PUT /v1/agents/{name}`, name from the
   * definition): new content becomes the next version, the same content as
   * the latest answers that version unchanged (so it is retried through
   * outages). Refusals are 422 naming the field.
   */
  async applyAgent(definition: AgentDefinition, options: CallOptions = {}): Promise<AgentBody> {
    return this.#unwrap(
      `PUT /v1/agents/${definition.name}`,
      this.api.PUT("/v1/agents/{name}", {
        params: { path: { name: definition.name } },
        body: definition,
        fetch: this.#sender({ retry: true, buffer: true, signal: options.signal }),
      }),
    );
  }

  /** An agent's latest version, or the given one (`GET /v1/agents/{name}[/versions/{version}]`). */
  async getAgent(name: string, options: CallOptions & { version?: number } = {}): Promise<AgentBody> {
    const fetch = this.#sender({ retry: true, buffer: true, signal: options.signal });
    if (options.version !== undefined) {
      return this.#unwrap(
        `GET /v1/agents/${name}/versions/${options.version}`,
        this.api.GET("/v1/agents/{name}/versions/{version}", {
          params: { path: { name, version: options.version } },
          fetch,
        }),
      );
    }
    return this.#unwrap(`GET /v1/agents/${name}`, this.api.GET("/v1/agents/{name}", { params: { path: { name } }, fetch }));
  }

  /** The tenant's agents, the latest version of each (`GET /v1/agents`). */
  async listAgents(options: CallOptions = {}): Promise<AgentBody[]> {
    const list = await this.#unwrap(
      "GET /v1/agents",
      this.api.GET("/v1/agents", { fetch: this.#sender({ retry: true, buffer: true, signal: options.signal }) }),
    );
    return list.agents;
  }

  // ----- webhooks ------------------------------------------------------------------------

  /** Subscribe a URL to the tenant's events (`POST /v1/webhooks`); the answer's `secret` (`whsec_…`) is shown this once. Not retried. */
  async createWebhook(subscription: NewSubscription, options: CallOptions = {}): Promise<CreatedSubscription> {
    return this.#unwrap(
      "POST /v1/webhooks",
      this.api.POST("/v1/webhooks", {
        body: subscription,
        fetch: this.#sender({ retry: false, buffer: true, signal: options.signal }),
      }),
    );
  }

  /** Remove a subscription (`DELETE /v1/webhooks/{id}`). */
  async deleteWebhook(subscriptionId: string, options: CallOptions = {}): Promise<void> {
    await this.#unwrap(
      `DELETE /v1/webhooks/${subscriptionId}`,
      this.api.DELETE("/v1/webhooks/{id}", {
        params: { path: { id: subscriptionId } },
        fetch: this.#sender({ retry: true, buffer: true, signal: options.signal }),
      }),
    );
  }
}
