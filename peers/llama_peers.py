#!/usr/bin/env python3
"""Times other tools on a Llama-architecture GGUF checkpoint, in the lines of autofusion's
`llama` bench (`cargo run --release -p llama_generate -- --model FILE --bench`), on the same
thread count:

    pip install torch transformers accelerate gguf numpy onnx onnxruntime [llama-cpp-python]
    python3 peers/llama_peers.py --model FILE.gguf [--threads 2] [--quick] [--only ort,hf,llamacpp]

- hf: Hugging Face transformers, the GGUF loaded by transformers (weights dequantised to f32).
  Prefill: one forward of S tokens with the cache, last position's logits only. Decode:
  `generate` (greedy) of 1 and of 1 + N tokens after a prompt of T tokens; N over the time
  difference.
- ort: onnxruntime on the same weights exported with their KV cache: inputs `input_ids`,
  `past_key_values.{i}.key/value` ([1, KV heads, past, head dim]), outputs `logits` (last
  position) and `present.{i}.key/value`, as optimum's decoder exports are laid out. The export
  is a plain torch Llama over transformers' weights, checked against transformers' logits
  before it is timed. Prefill: one run from an empty past; decode: single steps after T.
- llamacpp: llama.cpp through llama-cpp-python, if installed, on the checkpoint written back
  as an F32 GGUF (so it reads what autofusion reads). Prefill: `eval` of S tokens from an
  empty cache; decode: single-token `eval`s after T.

Lines: `<peer> f32 prefill S=<n>: X tok/s` and `<peer> f32 decode ctx=<T>: X tok/s`; medians.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def median_time(fn, rounds):
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def prompt(n, vocab, seed=0):
    return [(i * 7919 + seed * 104729) % vocab for i in range(n)]


def load_hf(gguf_path):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    ).eval()
    return model


def time_hf(model, prefills, contexts, rounds, steps):
    import torch

    vocab = model.config.vocab_size
    with torch.no_grad():
        for s in prefills:
            ids = torch.tensor([prompt(s, vocab)])
            model(ids, logits_to_keep=1)
            t = median_time(lambda: model(ids, logits_to_keep=1), rounds)
            print(f"hf f32 prefill S={s}: {s / t:.1f} tok/s", flush=True)
        for ctx in contexts:
            ids = torch.tensor([prompt(max(ctx, 1), vocab, 7)])
            greedy = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
            gen = lambda n: model.generate(ids, max_new_tokens=n, min_new_tokens=n, **greedy)
            gen(2)
            one = median_time(lambda: gen(1), rounds)
            many = median_time(lambda: gen(1 + steps), rounds)
            print(f"hf f32 decode ctx={ctx}: {steps / (many - one):.1f} tok/s", flush=True)


def export_onnx(model, path):
    """A plain torch Llama over `model`'s weights with the KV cache as inputs and outputs."""
    import torch

    cfg = model.config
    n_layers, heads, kv = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads
    dh = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    rope = getattr(cfg, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
    eps = cfg.rms_norm_eps

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            # Registered, so the weights export as initializers.
            self.llama = model

        def forward(self, input_ids, *past):
            m = self.llama.model
            s = input_ids.shape[1]
            p = past[0].shape[2]
            pos = torch.arange(s, dtype=torch.float32) + p
            inv = theta ** (-torch.arange(0, dh, 2, dtype=torch.float32) / dh)
            ang = pos[:, None] * inv[None, :]
            cos = torch.cat([ang.cos(), ang.cos()], -1)
            sin = torch.cat([ang.sin(), ang.sin()], -1)

            def rot(x):
                a, b = x[..., : dh // 2], x[..., dh // 2 :]
                return x * cos + torch.cat([-b, a], -1) * sin

            def norm(x, w):
                return w * (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps))

            h = m.embed_tokens(input_ids)
            presents = []
            t = p + s
            mask = torch.full((s, t), float("-inf")).triu(p + 1)
            for i, layer in enumerate(m.layers):
                a = layer.self_attn
                x = norm(h, layer.input_layernorm.weight)
                q = a.q_proj(x).view(1, s, heads, dh).transpose(1, 2)
                k = a.k_proj(x).view(1, s, kv, dh).transpose(1, 2)
                v = a.v_proj(x).view(1, s, kv, dh).transpose(1, 2)
                k = torch.cat([past[2 * i], rot(k)], 2)
                v = torch.cat([past[2 * i + 1], v], 2)
                presents += [k, v]
                kk = k.repeat_interleave(heads // kv, 1)
                vv = v.repeat_interleave(heads // kv, 1)
                att = (rot(q) @ kk.transpose(-1, -2)) / dh**0.5 + mask
                o = (att.softmax(-1) @ vv).transpose(1, 2).reshape(1, s, heads * dh)
                h = h + a.o_proj(o)
                x = norm(h, layer.post_attention_layernorm.weight)
                mlp = layer.mlp
                h = h + mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
            logits = self.llama.lm_head(norm(h[:, -1:], m.norm.weight))
            return (logits, *presents)

    names = [f"past_key_values.{i}.{kind}" for i in range(n_layers) for kind in ("key", "value")]
    outs = [f"present.{i}.{kind}" for i in range(n_layers) for kind in ("key", "value")]
    ids = torch.tensor([[1, 2, 3]])
    past = [torch.zeros(1, kv, 2, dh) for _ in names]
    axes = {"input_ids": {1: "sequence"}}
    axes.update({n: {2: "past"} for n in names})
    axes.update({n: {2: "total"} for n in outs})
    step = Step().eval()
    with torch.no_grad():
        torch.onnx.export(
            step, (ids, *past), str(path), input_names=["input_ids", *names],
            output_names=["logits", *outs], dynamic_axes=axes, opset_version=17, dynamo=False,
        )
        # Checked against transformers before it is timed.
        probe = torch.tensor([prompt(9, model.config.vocab_size, 3)])
        want = model(probe).logits[0, -1].numpy()
        got = step(probe, *[torch.zeros(1, kv, 0, dh) for _ in names])[0][0, -1].numpy()
        err = float(np.abs(got - want).max())
        assert err <= 1e-4 * float(np.abs(want).max()), f"the export's logits are off by {err}"
    return (kv, dh, names)


def time_ort(model, path, threads, prefills, contexts, rounds, steps):
    import onnxruntime as ort

    kv, dh, names = export_onnx(model, path)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    vocab = model.config.vocab_size
    empty = {n: np.zeros((1, kv, 0, dh), np.float32) for n in names}

    def run(ids, past):
        out = sess.run(None, {"input_ids": np.array([ids], np.int64), **past})
        return dict(zip(names, out[1:]))

    for s in prefills:
        ids = prompt(s, vocab)
        run(ids, empty)
        t = median_time(lambda: run(ids, empty), rounds)
        print(f"ort f32 prefill S={s}: {s / t:.1f} tok/s", flush=True)
    for ctx in contexts:
        past = run(prompt(max(ctx, 1), vocab, 7), empty) if ctx else empty

        def decode():
            p = past
            for k in range(steps):
                p = run([k % vocab], p)

        decode()
        t = median_time(decode, rounds)
        print(f"ort f32 decode ctx={ctx}: {steps / t:.1f} tok/s", flush=True)


def write_f32_gguf(src, dst):
    """`src` with every tensor dequantised to F32, metadata copied."""
    import gguf
    from gguf.quants import dequantize

    r = gguf.GGUFReader(str(src))
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(dst), arch=arch)
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.file_type"):
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, field.contents(), vtype, sub_type=field.types[-1])
        else:
            w.add_key_value(key, field.contents(), vtype)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    for t in r.tensors:
        data = dequantize(t.data, t.tensor_type).astype(np.float32)
        w.add_tensor(t.name, data.reshape([int(d) for d in reversed(t.shape)]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def time_llamacpp(gguf_path, tmp, threads, prefills, contexts, rounds, steps):
    try:
        from llama_cpp import Llama
    except ImportError:
        print("llamacpp: llama-cpp-python is not installed (pip install llama-cpp-python)", flush=True)
        return
    f32 = Path(tmp) / "model-f32.gguf"
    write_f32_gguf(gguf_path, f32)
    n_ctx = max(prefills + [c + steps + 1 for c in contexts])
    llm = Llama(model_path=str(f32), n_ctx=n_ctx, n_batch=max(prefills + [512]), n_threads=threads,
                n_threads_batch=threads, verbose=False)
    vocab = llm.n_vocab()
    for s in prefills:
        ids = prompt(s, vocab)

        def prefill():
            llm.reset()
            llm.eval(ids)

        prefill()
        t = median_time(prefill, rounds)
        print(f"llamacpp f32 prefill S={s}: {s / t:.1f} tok/s", flush=True)
    for ctx in contexts:
        llm.reset()
        if ctx:
            llm.eval(prompt(ctx, vocab, 7))

        def decode():
            llm.n_tokens = ctx
            llm._ctx.kv_cache_seq_rm(-1, ctx, -1)
            for k in range(steps):
                llm.eval([k % vocab])

        decode()
        t = median_time(decode, rounds)
        print(f"llamacpp f32 decode ctx={ctx}: {steps / t:.1f} tok/s", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="a GGUF file")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("AUTOFUSION_THREADS", os.cpu_count())))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="hf,ort,llamacpp")
    a = ap.parse_args()
    import torch

    torch.set_num_threads(a.threads)
    prefills, contexts = ([128], [0, 512]) if a.quick else ([128, 512], [0, 512, 2048])
    rounds, steps = (3, 4) if a.quick else (7, 8)
    only = a.only.split(",")
    print(f"llama peers: {a.model}, {a.threads} threads, torch {torch.__version__}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        if "hf" in only or "ort" in only:
            model = load_hf(a.model)
            if "hf" in only:
                time_hf(model, prefills, contexts, rounds, steps)
            if "ort" in only:
                time_ort(model, Path(tmp) / "model.onnx", a.threads, prefills, contexts, rounds, steps)
            del model
        if "llamacpp" in only:
            time_llamacpp(a.model, tmp, a.threads, prefills, contexts, rounds, steps)


if __name__ == "__main__":
    sys.exit(main())
