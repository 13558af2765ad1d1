// Greedy decode of a GGUF file in llama.cpp through node-llama-cpp's prebuilt CPU build: the
// peer the engine benchmark measures beside rollout on the same weights (docs/perf.md).
//
//   node bench/peer/llamacpp.mjs '{"module":"/abs/node_modules/node-llama-cpp","model":"m.gguf",
//                                  "prompts":[[1],[1]],"tokens":64,"threads":2}'
//
// Each prompt is one sequence (BOS alone for the decode figures) that takes `tokens` greedy
// tokens (temperature 0, generating on past EOS as rollout's benchmarks do); all sequences decode concurrently in one context,
// which node-llama-cpp batches into one llama_decode per step. Prints one JSON object: the tokens of each sequence,
// batch-1 decode tokens/s (timed from the first token on, as rollout's decode figure is) and
// the aggregate tokens/s of all sequences (timed from the start, as rollout's concurrent
// figure is).
import {pathToFileURL} from "node:url";
import {join} from "node:path";

const args = JSON.parse(process.argv[process.argv.length - 1]);
const {getLlama} = await import(pathToFileURL(join(args.module, "dist", "index.js")).href);

const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const model = await llama.loadModel({modelPath: args.model, gpuLayers: 0, useMmap: true});
const prompts = args.prompts;
const seqs = prompts.length;
const tokens = args.tokens;
const longest = Math.max(...prompts.map((p) => p.length));
const context = await model.createContext({
    sequences: seqs,
    contextSize: seqs * (longest + tokens + 16),
    batchSize: Math.max(seqs, 32),
    threads: args.threads,
});

async function decode(seq, prompt) {
    const out = [];
    let first = 0;
    for await (const tok of seq.evaluate(prompt, {temperature: 0, yieldEogToken: true})) {
        if (out.length === 0) first = performance.now();
        out.push(tok);
        if (out.length >= tokens) break;
    }
    return {out, first, end: performance.now()};
}

// Warm up: load the weights into cache and start the threads, as rollout's figures do.
{
    const s = context.getSequence();
    let n = 0;
    for await (const _ of s.evaluate(prompts[0], {temperature: 0, yieldEogToken: true})) if (++n >= 2) break;
    s.dispose();
}

const sequences = Array.from({length: seqs}, () => context.getSequence());
const start = performance.now();
const runs = await Promise.all(sequences.map((s, i) => decode(s, prompts[i])));
const end = performance.now();
const r0 = runs[0];
console.log(JSON.stringify({
    tokens: runs.map((r) => r.out),
    decode_tokens_per_s: r0.out.length > 1 ? (r0.out.length - 1) / ((r0.end - r0.first) / 1000) : 0,
    aggregate_tokens_per_s: (seqs * tokens) / ((end - start) / 1000),
    threads: context.currentThreads,
    build: llama.buildType,
}));
await context.dispose();
await model.dispose();
await llama.dispose();
