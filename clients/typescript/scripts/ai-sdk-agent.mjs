// An agent built with the Vercel AI SDK and its mock model (`ai/test`: no network, no LLM), for
// the ledger's tests (tests/integrations/test_ai_sdk.py). Each run is a new process, as an agent
// restarted while a call is held:
//   node scripts/ai-sdk-agent.mjs start|resume|approve-in-sdk STATE_FILE EFFECTS_FILE
// `start` runs until the ledger holds the call and keeps the messages and the approval requests
// in STATE_FILE; `resume` asks the ledger (ledgerApprovalResponses) and continues; the tool's
// effects are lines of EFFECTS_FILE (the provider's own record). LEDGERWEB_URL, LEDGERWEB_TOKEN.
import { appendFileSync, existsSync, readFileSync, writeFileSync } from "node:fs";

import { generateText, jsonSchema, stepCountIs, tool } from "ai";
import { MockLanguageModelV4 } from "ai/test";

import { LedgerClient } from "../dist/src/index.js";
import {
  ledgerApprovalResponses,
  ledgeredExecute,
  ledgerToolApproval,
} from "../dist/src/ai-sdk.js";

const [phase, stateFile, effectsFile] = process.argv.slice(2);
const ledger = new LedgerClient(process.env.LEDGERWEB_URL ?? "", process.env.LEDGERWEB_TOKEN ?? "");
const ASK = { customer: "cus_1", title: "Printer on fire", priority: 3 };

const spec = {
  ledger,
  tenant: "acme",
  taskId: "task-ai-sdk",
  toolName: "open_ticket",
  key: (input) => `ticket:acme:${input.customer}:${input.title}`,
};

async function openTicket(input) {
  const made = existsSync(effectsFile) ? readFileSync(effectsFile, "utf8").split("\n").length : 1;
  const ticket = { id: `T-${made}`, priority: input.priority };
  appendFileSync(effectsFile, JSON.stringify({ ...input, id: ticket.id }) + "\n");
  return ticket;
}

const tools = {
  open_ticket: tool({
    description: "Open a support ticket for a customer.",
    inputSchema: jsonSchema({
      type: "object",
      properties: {
        customer: { type: "string" },
        title: { type: "string" },
        priority: { type: "integer" },
      },
      required: ["customer", "title", "priority"],
    }),
    execute: ledgeredExecute(spec, openTicket),
  }),
};

const usage = {
  inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 1, text: 1, reasoning: 0 },
};
const model = new MockLanguageModelV4({
  // The model asks for the ticket, then repeats what the tool answered (or that it was denied).
  doGenerate: async ({ prompt }) => {
    const results = prompt
      .flatMap((message) => (message.role === "tool" ? message.content : []))
      .filter((part) => part.type === "tool-result");
    if (results.length) {
      const text = `done: ${JSON.stringify(results.at(-1).output)}`;
      return { content: [{ type: "text", text }], finishReason: { unified: "stop", raw: "stop" }, usage, warnings: [] };
    }
    const call = { type: "tool-call", toolCallId: "call-1", toolName: "open_ticket", input: JSON.stringify(ASK) };
    return { content: [call], finishReason: { unified: "tool-calls", raw: "tool_calls" }, usage, warnings: [] };
  },
});
const toolApproval = { open_ticket: ledgerToolApproval(spec) };

if (phase === "start") {
  const messages = [{ role: "user", content: "open it" }];
  const result = await generateText({ model, tools, messages, toolApproval, stopWhen: stepCountIs(3) });
  const requests = result.content.filter((part) => part.type === "tool-approval-request");
  if (requests.length) {
    writeFileSync(stateFile, JSON.stringify({ messages: [...messages, ...result.response.messages], requests }));
    console.log(`held: ${requests.map((r) => r.toolCall.toolName).join(",")}`);
  } else {
    console.log(result.text);
  }
} else {
  const { messages, requests } = JSON.parse(readFileSync(stateFile, "utf8"));
  let responses;
  if (phase === "approve-in-sdk") {
    responses = requests.map((r) => ({ type: "tool-approval-response", approvalId: r.approvalId, approved: true }));
  } else {
    const decided = await ledgerApprovalResponses(requests, { open_ticket: spec }, { waitMs: 2000 });
    if (decided.pending.length) {
      console.log("pending");
      process.exit(0);
    }
    responses = decided.responses;
  }
  const result = await generateText({
    model,
    tools,
    messages: [...messages, { role: "tool", content: responses }],
    toolApproval,
    stopWhen: stepCountIs(3),
  });
  console.log(result.text);
}
