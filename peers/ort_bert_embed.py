#!/usr/bin/env python3
"""A BERT sentence encoder's ONNX export in onnxruntime, served to `cargo bench -p bert_embed`
so that it and our fused kernels are timed side by side in one run on the same token ids.

    python3 peers/ort_bert_embed.py serve --model MODEL.onnx --threads 2

MODEL.onnx: the export of peers/export_bert_onnx.py (inputs input_ids, attention_mask,
token_type_ids, int64 [B, S]; output last_hidden_state). The session uses every graph
optimisation and `--threads` intra-op threads (one inter-op). Mean pooling over the attention
mask and L2 normalisation follow in numpy, inside the timed call (they are part of what our
side runs too). One JSON line answers each command read from stdin:
    input FILE       read batches from FILE (JSON: [{"ids": [[...]], "mask": [[...]]}, ...],
                     each padded [B, S]); run them once; write the embeddings of all
                     ([sum of B, hidden] f32) to FILE.out
    time N           run all the batches N times; reply with the time of each round (ms)
    quit
A failure is replied as {"error": "..."} and the server keeps serving.
"""

import argparse
import json
import sys
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["serve"])
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = args.threads
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(args.model, opts, providers=["CPUExecutionProvider"])
    print(json.dumps({"onnxruntime": ort.__version__}), flush=True)
    feeds = []

    def embed(feed):
        h = sess.run(["last_hidden_state"], feed)[0]
        m = feed["attention_mask"][..., None].astype(np.float32)
        pooled = (h * m).sum(1) / np.maximum(m.sum(1), 1e-9)
        return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)

    for line in sys.stdin:
        cmd = line.split()
        try:
            if not cmd or cmd[0] == "quit":
                break
            if cmd[0] == "input":
                path = cmd[1]
                with open(path) as f:
                    batches = json.load(f)
                feeds = []
                for b in batches:
                    ids = np.array(b["ids"], dtype=np.int64)
                    mask = np.array(b["mask"], dtype=np.int64)
                    feeds.append({"input_ids": ids, "attention_mask": mask,
                                  "token_type_ids": np.zeros_like(ids)})
                out = np.concatenate([embed(f) for f in feeds])
                out.astype("<f4").tofile(path + ".out")
                print(json.dumps({"ok": True}), flush=True)
            elif cmd[0] == "time":
                times = []
                for _ in range(int(cmd[1])):
                    t = time.perf_counter()
                    for f in feeds:
                        embed(f)
                    times.append((time.perf_counter() - t) * 1e3)
                print(json.dumps({"times_ms": times}), flush=True)
            else:
                raise ValueError(f"unknown command {cmd[0]}")
        except Exception as e:  # reply and keep serving
            print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)


if __name__ == "__main__":
    main()
