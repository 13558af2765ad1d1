// A tool-calling conversation with the official OpenAI Node client against a Rollout server
// (TestChatToolCallsOpenAINode runs it). It prints one JSON object with what it saw; the Go
// test asserts on it. Env: ROLLOUT_URL (the server's base URL), TOOLS_JSON (the tools list).
import OpenAI from 'openai';

const client = new OpenAI({ baseURL: process.env.ROLLOUT_URL + '/v1', apiKey: 'unused', maxRetries: 0 });
const tools = JSON.parse(process.env.TOOLS_JSON);
const base = { model: 'builtin:tiny', temperature: 0, max_tokens: 120, tools };
const question = [{ role: 'user', content: 'What is 2+3?' }];

const first = await client.chat.completions.create({ ...base, messages: question });
const msg = first.choices[0].message;
const call = msg.tool_calls?.[0];

const second = await client.chat.completions.create({
  ...base,
  messages: [...question, msg, { role: 'tool', tool_call_id: call?.id ?? 'none', content: '5' }],
});

const stream = client.chat.completions.stream({ ...base, messages: question });
const streamed = await stream.finalChatCompletion();

let badRequest = null;
try {
  await client.chat.completions.create({ ...base, messages: question, tool_choice: { type: 'function', function: { name: 'nope' } } });
} catch (e) {
  badRequest = { status: e.status, type: e.error?.type ?? e.type, param: e.error?.param ?? e.param, message: e.message };
}

console.log(JSON.stringify({
  first: { finish: first.choices[0].finish_reason, content: msg.content, tool_calls: msg.tool_calls ?? [] },
  second: { finish: second.choices[0].finish_reason, content: second.choices[0].message.content },
  streamed: { finish: streamed.choices[0].finish_reason, tool_calls: streamed.choices[0].message.tool_calls ?? [] },
  badRequest,
}));
