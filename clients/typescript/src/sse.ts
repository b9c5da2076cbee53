/**
 * Reading server-sent events (the HTML standard's `text/event-stream`) from
 * a fetch body, with `eventsource-parser` doing the parsing.
 */

import { createParser, type EventSourceMessage } from "eventsource-parser";

/** One frame of a stream: its `event` (default `message`), `data` and `id`, if any. */
export interface SseFrame {
  /** The frame's `event:` field; `message` when absent. */
  event: string;
  /** The frame's `data:` lines joined with newlines. */
  data: string;
  /** The frame's `id:` field, if any. */
  id: string | undefined;
}

/**
 * The frames of `body`, in order, until it ends. Every chunk (frames and
 * keep-alive comments alike) resets an idle timer; after `idleMs` without
 * one `onIdle` is called (it should abort the request, which makes the read
 * throw). A read error (the connection cut) is thrown.
 */
export async function* readSse(
  body: ReadableStream<Uint8Array>,
  idleMs: number,
  onIdle: () => void,
): AsyncGenerator<SseFrame, void, undefined> {
  const queue: SseFrame[] = [];
  const parser = createParser({
    onEvent(message: EventSourceMessage) {
      queue.push({ event: message.event ?? "message", data: message.data, id: message.id });
    },
  });
  const decoder = new TextDecoder();
  const reader = body.getReader();
  let idle: ReturnType<typeof setTimeout> | undefined;
  const arm = () => {
    if (idle !== undefined) {
      clearTimeout(idle);
    }
    idle = setTimeout(onIdle, idleMs);
  };
  try {
    arm();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) {
        parser.feed(decoder.decode());
        yield* queue.splice(0);
        return;
      }
      arm();
      parser.feed(decoder.decode(value, { stream: true }));
      while (queue.length > 0) {
        yield queue.shift() as SseFrame;
      }
    }
  } finally {
    if (idle !== undefined) {
      clearTimeout(idle);
    }
    reader.cancel().catch(() => undefined);
    reader.releaseLock();
  }
}

/**
 * The lines of a JSON Lines body, each parsed, in order (empty lines
 * skipped). A line that is not JSON throws a `SyntaxError` naming its number.
 */
export async function* readJsonLines(body: ReadableStream<Uint8Array>): AsyncGenerator<unknown, void, undefined> {
  const decoder = new TextDecoder();
  const reader = body.getReader();
  let buffer = "";
  let number = 0;
  const parse = (line: string): unknown => {
    try {
      return JSON.parse(line);
    } catch (e) {
      throw new SyntaxError(`line ${number} of the JSON Lines answer is not JSON: ${(e as Error).message}`);
    }
  };
  try {
    for (;;) {
      const { done, value } = await reader.read();
      buffer += done ? decoder.decode() : decoder.decode(value, { stream: true });
      let newline: number;
      while ((newline = buffer.indexOf("\n")) >= 0) {
        const line = buffer.slice(0, newline).trim();
        buffer = buffer.slice(newline + 1);
        number++;
        if (line !== "") {
          yield parse(line);
        }
      }
      if (done) {
        number++;
        if (buffer.trim() !== "") {
          yield parse(buffer.trim());
        }
        return;
      }
    }
  } finally {
    reader.cancel().catch(() => undefined);
    reader.releaseLock();
  }
}
