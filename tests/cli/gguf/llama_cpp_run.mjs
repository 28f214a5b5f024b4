// anvil's GGUF check: for each GGUF file, llama.cpp's tokenization of each job's text and its greedy
// continuation with each chosen token's probability, as JSON (one list per file).
//   node llama_cpp_run.mjs JOBS.json FILE.gguf[+ADAPTER.gguf]...   (+: a LoRA adapter GGUF applied at load)
import {getLlama, LlamaLogLevel} from "node-llama-cpp";
import fs from "node:fs";
const [jobsPath, ...modelPaths] = process.argv.slice(2);
const jobs = JSON.parse(fs.readFileSync(jobsPath, "utf8"));
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});
const all = [];
for (const spec of modelPaths) {
  const [modelPath, adapter] = spec.split("+");
  const model = await llama.loadModel({modelPath});
  const out = [];
  for (const job of jobs) {
    const tokenized = Array.from(model.tokenize(job.text));
    const context = await model.createContext({contextSize: job.ctx, batchSize: job.ctx, threads: 2,
                                               ...(adapter ? {lora: {adapters: [{filePath: adapter}]}} : {})});
    const seq = context.getSequence();
    const tokens = [], probs = [];
    if (job.n > 0) {
      // the prompt as llama.cpp's own tools give it: BOS first where the file asks for one (add_bos_token)
      const prompt = model.tokens.shouldPrependBosToken && model.tokens.bos != null
        ? [model.tokens.bos, ...tokenized] : tokenized;
      for await (const r of seq.evaluateWithMetadata(prompt, {confidence: true}, {temperature: 0})) {
        tokens.push(r.token);
        probs.push(r.confidence);
        if (tokens.length >= job.n) break;
      }
    }
    out.push({tokenized, tokens, probs});
    await context.dispose();
  }
  all.push(out);
  await model.dispose();
}
console.log(JSON.stringify(all));
