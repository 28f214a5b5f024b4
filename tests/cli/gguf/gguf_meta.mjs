// anvil's GGUF check: the metadata and tensor list of a GGUF file as @huggingface/gguf reads them, as JSON.
import {gguf} from "@huggingface/gguf";
const {metadata, tensorInfos} = await gguf(process.argv[2], {allowLocalFile: true});
const plain = (v) => (typeof v === "bigint" ? Number(v) : v);
const meta = {};
for (const [k, v] of Object.entries(metadata)) meta[k] = Array.isArray(v) ? {length: v.length, first: v.slice(0, 3).map(plain)} : plain(v);
const tensors = tensorInfos.map((t) => ({name: t.name, shape: t.shape.map(Number), dtype: t.dtype}));
console.log(JSON.stringify({metadata: meta, tensors}));
