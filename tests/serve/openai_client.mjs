// Drives `anvil serve` with the official OpenAI client (npm `openai`) and prints what it got as JSON for
// tests/serve/test_serve.py to check: node openai_client.mjs BASE_URL MODEL PROMPT MAX_TOKENS
import OpenAI from "openai";

const [baseURL, model, prompt, maxTokensArg] = process.argv.slice(2);
const max_tokens = Number(maxTokensArg);
const client = new OpenAI({ baseURL, apiKey: "not-needed", maxRetries: 0, timeout: 60_000 });

const out = {};
const models = await client.models.list();
out.models = models.data.map((m) => m.id);

const plain = await client.completions.create({ model, prompt, max_tokens, temperature: 0 });
out.completion = { text: plain.choices[0].text, finish: plain.choices[0].finish_reason, usage: plain.usage };

const stream = await client.completions.create({
  model, prompt, max_tokens, temperature: 0, stream: true, stream_options: { include_usage: true },
});
let streamed = "";
let streamFinish = null;
let streamUsage = null;
for await (const chunk of stream) {
  if (chunk.usage) streamUsage = chunk.usage;
  for (const c of chunk.choices) {
    streamed += c.text;
    if (c.finish_reason) streamFinish = c.finish_reason;
  }
}
out.streamed = { text: streamed, finish: streamFinish, usage: streamUsage };

const messages = [{ role: "user", content: prompt }];
const chat = await client.chat.completions.create({ model, messages, max_tokens, temperature: 0 });
out.chat = {
  role: chat.choices[0].message.role, text: chat.choices[0].message.content,
  finish: chat.choices[0].finish_reason, usage: chat.usage,
};

const chatStream = await client.chat.completions.create({ model, messages, max_tokens, temperature: 0, stream: true });
let chatText = "";
let chatRole = null;
for await (const chunk of chatStream) {
  for (const c of chunk.choices) {
    if (c.delta.role) chatRole = c.delta.role;
    if (c.delta.content) chatText += c.delta.content;
  }
}
out.chatStreamed = { role: chatRole, text: chatText };

try {
  await client.completions.create({ model: "no-such-model", prompt, max_tokens });
  out.unknownModel = "accepted";
} catch (e) {
  out.unknownModel = { status: e.status, message: e.message };
}
console.log(JSON.stringify(out));
