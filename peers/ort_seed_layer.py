#!/usr/bin/env python3
"""The seed layer in onnxruntime, served to `cargo bench --bench kernels` so both are timed
side by side in one run, on the same weights and inputs.

The layer (pre-LayerNorm block on one sequence, x: [S, D], weights stored [in, out]):
    h  = layer_norm(x, ln1_g, ln1_b, 1e-5)
    q, k, v = h @ w_q + b_q, h @ w_k + b_k, h @ w_v + b_v      (split into H heads)
    a  = softmax(q k^T / sqrt(D / H)) v, heads merged
    x1 = x + a @ w_o + b_o
    y  = x1 + silu(layer_norm(x1, ln2_g, ln2_b, 1e-5) @ w1 + b1) @ w2 + b2

    python3 peers/ort_seed_layer.py serve --dir DIR --threads 2

DIR holds `manifest.json` ({"d", "heads", "params": [{"name", "shape", "file"}]}) and one
little-endian f32 file per parameter, written by the bench. The server answers one JSON line
per command read from stdin:
    input FILE S   load x ([S, D] f32) from FILE; run onnxruntime once; write the float64
                   reference forward (cast to f32) to FILE.ref; reply with onnxruntime's
                   error against it
    time N         run onnxruntime N times on the current input; reply with the times (ms)
    quit
A failure is replied as {"error": "..."} and the server keeps serving.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

EPS = 1e-5
ORDER = ["x", "ln1_g", "ln1_b", "w_q", "b_q", "w_k", "b_k", "w_v", "b_v", "w_o", "b_o",
         "ln2_g", "ln2_b", "w1", "b1", "w2", "b2"]


def load_weights(d):
    man = json.loads((d / "manifest.json").read_text())
    w = {}
    for p in man["params"]:
        w[p["name"]] = np.fromfile(d / p["file"], dtype="<f4").reshape(p["shape"])
    missing = [n for n in ORDER[1:] if n not in w]
    if missing:
        raise SystemExit(f"manifest lacks {missing}")
    return man["d"], man["heads"], w


def forward_f64(w, x, heads):
    """The layer in float64: the oracle both implementations are checked against."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    x = x.astype(np.float64)
    s, d = x.shape
    dh = d // heads

    def norm(t, g, b):
        mu = t.mean(-1, keepdims=True)
        var = ((t - mu) ** 2).mean(-1, keepdims=True)
        return (t - mu) / np.sqrt(var + EPS) * g + b

    def heads_of(t):
        return t.reshape(s, heads, dh).transpose(1, 0, 2)

    h = norm(x, w["ln1_g"], w["ln1_b"])
    q, k, v = (heads_of(h @ w[f"w_{n}"] + w[f"b_{n}"]) for n in "qkv")
    sc = q @ k.transpose(0, 2, 1) / np.sqrt(dh)
    p = np.exp(sc - sc.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    a = (p @ v).transpose(1, 0, 2).reshape(s, d)
    x1 = x + a @ w["w_o"] + w["b_o"]
    f = norm(x1, w["ln2_g"], w["ln2_b"]) @ w["w1"] + w["b1"]
    f = f / (1.0 + np.exp(-f))
    return x1 + f @ w["w2"] + w["b2"]


def build_onnx(w, d, heads):
    from onnx import TensorProto, checker, helper, numpy_helper

    dh = d // heads
    nodes = []
    inits = [numpy_helper.from_array(v, k) for k, v in w.items()]
    inits += [numpy_helper.from_array(np.array([0, heads, dh], np.int64), "to_heads"),
              numpy_helper.from_array(np.array([0, d], np.int64), "to_rows"),
              numpy_helper.from_array(np.array(1.0 / np.sqrt(dh), np.float32), "scale")]

    def op(kind, ins, name, **attrs):
        nodes.append(helper.make_node(kind, ins, [name], name=name, **attrs))
        return name

    def dense(t, n, name):
        return op("Add", [op("MatMul", [t, f"w{n}"], f"{name}_mm"), f"b{n}"], name)

    h = op("LayerNormalization", ["x", "ln1_g", "ln1_b"], "h", axis=-1, epsilon=EPS)
    qkv = [op("Transpose", [op("Reshape", [dense(h, f"_{n}", n), "to_heads"], f"{n}_r")], f"{n}_h", perm=[1, 0, 2])
           for n in "qkv"]
    kt = op("Transpose", [qkv[1]], "k_t", perm=[0, 2, 1])
    sc = op("Mul", [op("MatMul", [qkv[0], kt], "qk"), "scale"], "scores")
    a = op("MatMul", [op("Softmax", [sc], "p", axis=-1), qkv[2]], "pv")
    a = op("Reshape", [op("Transpose", [a], "pv_t", perm=[1, 0, 2]), "to_rows"], "a")
    x1 = op("Add", ["x", dense(a, "_o", "o")], "x1")
    h2 = op("LayerNormalization", [x1, "ln2_g", "ln2_b"], "h2", axis=-1, epsilon=EPS)
    f = dense(h2, "1", "f")
    f = op("Mul", [f, op("Sigmoid", [f], "f_sig")], "f_silu")
    op("Add", [x1, dense(f, "2", "g")], "y")
    graph = helper.make_graph(nodes, "seed_layer",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["S", d])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["S", d])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    checker.check_model(model)
    return model


def session(model, threads):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def serve(a):
    import onnxruntime as ort

    d, heads, w = load_weights(Path(a.dir))
    sess = session(build_onnx(w, d, heads), a.threads)
    reply({"ready": True, "onnxruntime": ort.__version__, "threads": a.threads})
    x = None
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        try:
            if cmd[0] == "quit":
                return
            if cmd[0] == "input":
                path, s = Path(cmd[1]), int(cmd[2])
                x = np.fromfile(path, dtype="<f4").reshape(s, d)
                y = forward_f64(w, x, heads)
                y.astype("<f4").tofile(str(path) + ".ref")
                got = sess.run(None, {"x": x})[0]
                rel = float(np.abs(got - y).max() / max(np.abs(y).max(), 1e-30))
                reply({"ok": True, "max_rel_err": rel})
            elif cmd[0] == "time":
                if x is None:
                    raise ValueError("no input loaded")
                times = []
                for _ in range(int(cmd[1])):
                    t0 = time.perf_counter()
                    sess.run(None, {"x": x})
                    times.append((time.perf_counter() - t0) * 1e3)
                reply({"ok": True, "times_ms": times})
            else:
                raise ValueError(f"unknown command `{cmd[0]}`")
        except Exception as e:  # the bench reads the message; the server goes on
            reply({"error": f"{type(e).__name__}: {e}"})


def reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--dir", required=True)
    s.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    serve(a)


if __name__ == "__main__":
    main()
