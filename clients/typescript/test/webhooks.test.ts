// Standard Webhooks verification: the specification's example, and a real
// delivery from the dispatcher to a local server.

import assert from "node:assert/strict";
import { createServer, type IncomingHttpHeaders } from "node:http";
import { test } from "node:test";

import { WebhookVerificationError, verifyWebhook } from "../src/index.js";
import { client, eventually, scriptConfig } from "./helpers.js";

test("the specification's example verifies, and a changed byte does not", async () => {
  // The example of the Standard Webhooks reference libraries (as in dispatcher/src/webhooks.rs).
  const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
  const body = '{"test": 2432232314}';
  const headers = {
    "webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek",
    "webhook-timestamp": "1614265330",
    "webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
  };
  const nowMs = 1614265330_000 + 10_000;
  const verified = await verifyWebhook(secret, headers, body, { nowMs });
  assert.deepEqual(verified, { id: "msg_p5jXN8AQM9LWM0D4loKWxJek", timestamp: 1614265330, payload: { test: 2432232314 } });
  // Several signatures (a secret being rotated): one match is enough.
  await verifyWebhook(secret, { ...headers, "webhook-signature": `v1,AAAA ${headers["webhook-signature"]}` }, body, { nowMs });
  await assert.rejects(verifyWebhook(secret, headers, body.replace("4", "5"), { nowMs }), WebhookVerificationError);
  await assert.rejects(verifyWebhook(secret, { ...headers, "webhook-id": "msg_other" }, body, { nowMs }), WebhookVerificationError);
  await assert.rejects(verifyWebhook(secret, headers, body), /beyond the tolerance/);
  const { "webhook-signature": _, ...unsigned } = headers;
  await assert.rejects(verifyWebhook(secret, unsigned, body, { nowMs }), /missing header/);
});

test("repeated signature headers verify; an empty secret or a repeated id with two values is refused", async () => {
  const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
  const body = '{"test": 2432232314}';
  const good = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
  const base = { "webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek", "webhook-timestamp": "1614265330" };
  const nowMs = 1614265330_000;
  // Node joins a repeated header it does not know with ", "; its raw form is a list; fetch's Headers joins too.
  await verifyWebhook(secret, { ...base, "webhook-signature": `v1,AAAA, ${good}` }, body, { nowMs });
  await verifyWebhook(secret, { ...base, "webhook-signature": ["v1,AAAA", good] }, body, { nowMs });
  const fetchHeaders = new Headers(base);
  fetchHeaders.append("webhook-signature", "v1,AAAA v2,BBBB");
  fetchHeaders.append("webhook-signature", good);
  await verifyWebhook(secret, fetchHeaders, body, { nowMs });
  await assert.rejects(verifyWebhook(secret, { ...base, "webhook-signature": ["v1,AAAA", "v1,BBBB"] }, body, { nowMs }), /no v1 signature/);
  for (const empty of ["", "whsec_"]) {
    await assert.rejects(verifyWebhook(empty, { ...base, "webhook-signature": good }, body, { nowMs }), (e: unknown) => {
      assert.ok(e instanceof WebhookVerificationError, `${JSON.stringify(empty)}: ${String(e)}`);
      assert.match(e.message, /secret is empty/);
      return true;
    });
  }
  await assert.rejects(
    verifyWebhook(secret, { ...base, "webhook-id": ["msg_a", "msg_b"], "webhook-signature": good }, body, { nowMs }),
    (e: unknown) => e instanceof WebhookVerificationError && /webhook-id is repeated/.test(e.message),
  );
});

interface Delivery {
  headers: IncomingHttpHeaders;
  body: Buffer;
}

test("a real delivery verifies; a tampered body or an old timestamp does not", async () => {
  const deliveries: Delivery[] = [];
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      deliveries.push({ headers: req.headers, body: Buffer.concat(chunks) });
      res.writeHead(204).end();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  assert.ok(address !== null && typeof address === "object");
  const glia = client();
  const subscription = await glia.createWebhook({ url: `http://127.0.0.1:${address.port}/hook`, events: ["run.completed"] });
  try {
    assert.match(subscription.secret, /^whsec_/);
    const run = await glia.submitRun({ goal: "Say you are done.", config: scriptConfig("answer") });
    const delivery = await eventually("the run.completed delivery", () =>
      deliveries.find((d) => d.body.toString("utf8").includes(run.run_id)),
    );
    const verified = await verifyWebhook(subscription.secret, delivery.headers, delivery.body);
    assert.equal(verified.id, delivery.headers["webhook-id"]);
    const payload = verified.payload as { type: string; data: unknown };
    assert.equal(payload.type, "run.completed");
    assert.match(JSON.stringify(payload.data), new RegExp(run.run_id));
    // The same delivery as a fetch Headers object verifies too.
    const fetchHeaders = new Headers();
    for (const [k, v] of Object.entries(delivery.headers)) {
      if (typeof v === "string") {
        fetchHeaders.set(k, v);
      }
    }
    await verifyWebhook(subscription.secret, fetchHeaders, new Uint8Array(delivery.body));

    const tampered = Buffer.from(delivery.body.toString("utf8").replace("run.completed", "run.failed"));
    await assert.rejects(verifyWebhook(subscription.secret, delivery.headers, tampered), (e: unknown) => {
      assert.ok(e instanceof WebhookVerificationError);
      assert.match(e.message, /no v1 signature/);
      return true;
    });
    const sentAt = Number(delivery.headers["webhook-timestamp"]);
    await assert.rejects(
      verifyWebhook(subscription.secret, delivery.headers, delivery.body, { nowMs: (sentAt + 301) * 1000 }),
      /beyond the tolerance/,
    );
    await assert.rejects(verifyWebhook("whsec_" + btoa("another key, 24 bytes!!!"), delivery.headers, delivery.body), WebhookVerificationError);
  } finally {
    await glia.deleteWebhook(subscription.id);
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
});
