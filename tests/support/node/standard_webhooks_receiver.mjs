// A webhook receiver written as a Node user would: node's http server and the standardwebhooks npm
// package. It verifies each request with the secret in WEBHOOK_SECRET, answers 204 (or 400), and
// prints one JSON line per request, so the Python test sees what a Node consumer accepted.
import http from "node:http";
import { Webhook } from "standardwebhooks";

const webhook = new Webhook(process.env.WEBHOOK_SECRET);
const server = http.createServer((request, response) => {
  const chunks = [];
  request.on("data", (chunk) => chunks.push(chunk));
  request.on("end", () => {
    const body = Buffer.concat(chunks).toString("utf8");
    let line;
    try {
      const verified = webhook.verify(body, request.headers);
      line = { ok: true, verified, headers: request.headers };
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
