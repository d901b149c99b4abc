// A webhook receiver written as a Node user would: node's http server and the standardwebhooks npm
// package. It verifies each request with the secret in WEBHOOK_SECRET, answers 204 (or 400), and
// prints one JSON line per request, so the Python test sees what a Node consumer accepted. A request
// that carries a CloudEvent (ce- headers, or an application/cloudevents+json body) is also read with the
// CloudEvents SDK for JavaScript, and the event it found is printed too.
import http from "node:http";
import { HTTP } from "cloudevents";
import { Webhook } from "standardwebhooks";

function cloudEvent(headers, body) {
  const structured = (headers["content-type"] || "").startsWith("application/cloudevents+json");
  if (!structured && !("ce-specversion" in headers)) return undefined;
  try {
    const event = HTTP.toEvent({ headers, body });
    return { ok: true, attributes: JSON.parse(JSON.stringify(event)), data: event.data };
  } catch (error) {
    return { ok: false, error: String(error) };
  }
}

const webhook = new Webhook(process.env.WEBHOOK_SECRET);
const server = http.createServer((request, response) => {
  const chunks = [];
  request.on("data", (chunk) => chunks.push(chunk));
  request.on("end", () => {
    const body = Buffer.concat(chunks).toString("utf8");
    let line;
    try {
      const verified = webhook.verify(body, request.headers);
      line = { ok: true, verified, headers: request.headers, cloudevent: cloudEvent(request.headers, body) };
      response.writeHead(204).end();
    } catch (error) {
      line = { ok: false, error: String(error), headers: request.headers };
      response.writeHead(400).end();
    }
    process.stdout.write(JSON.stringify(line) + "\n");
  });
});
server.listen(0, "127.0.0.1", () => {
  process.stdout.write(JSON.stringify({ port: server.address().port }) + "\n");
});
process.on("SIGTERM", () => server.close(() => process.exit(0)));
