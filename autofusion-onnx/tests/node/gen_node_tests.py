#!/usr/bin/env python3
"""Writes the onnx package's backend node tests whose nodes are all of the given op types into OUT:
OUT/<test name>/model.onnx and OUT/<test name>/test_data_set_<i>/{input,output}_<j>.pb, the
layout of onnx/backend/test/data/node (the pip package ships the generators, not the data).

    python3 gen_node_tests.py OUT Add MatMul Softmax ...
"""
import sys
from pathlib import Path

from onnx import TensorProto, numpy_helper
from onnx.backend.test.case import node as node_cases


def tensor(value, name):
    if isinstance(value, TensorProto):
        return value
    return numpy_helper.from_array(value, name)


def main():
    out, ops = Path(sys.argv[1]), sys.argv[2:]
    n = 0
    # (collect_testcases gathers every op's cases on its first call only: filter here)
    for case in node_cases.collect_testcases(None):
        if not case.model or not case.data_sets:
            continue
        if any(nd.op_type not in ops for nd in case.model.graph.node):
            continue
        d = out / case.name
        d.mkdir(parents=True, exist_ok=True)
        (d / "model.onnx").write_bytes(case.model.SerializeToString())
        g = case.model.graph
        for i, (inputs, outputs) in enumerate(case.data_sets):
            ds = d / f"test_data_set_{i}"
            ds.mkdir(exist_ok=True)
            try:
                for j, x in enumerate(inputs):
                    (ds / f"input_{j}.pb").write_bytes(tensor(x, g.input[j].name).SerializeToString())
                for j, y in enumerate(outputs):
                    (ds / f"output_{j}.pb").write_bytes(tensor(y, g.output[j].name).SerializeToString())
            except Exception as e:  # sequences, maps, optional values: not tensors
                (ds / "skip").write_text(str(e))
        n += 1
    print(f"{n} node tests written to {out}")


if __name__ == "__main__":
    main()
