#!/usr/bin/env python3
"""Writes tests/fixtures/fixture.safetensors the way PyTorch users produce such files,
so the C++ reader is tested against bytes it did not write itself.

The layout is built by hand from the published format (8-byte little-endian header
length, JSON header, raw little-endian data), because Debian has no `safetensors`
package; the tensors come from torch when it is available (run with /usr/bin/python3),
otherwise from the fixed values below, which are the same.
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "data", "fixture.safetensors")

# name -> (safetensors dtype, struct code, shape, values)
TENSORS = {
    "linear.weight": ("F32", "f", [2, 3], [0.5, -1.25, 2.0, 3.5, -0.125, 1e-3]),
    "linear.bias": ("F64", "d", [2], [0.1, -0.2]),
    "step": ("I64", "q", [], [42]),
    "mask": ("BOOL", "?", [4], [True, False, False, True]),
    "half": ("F16", "e", [3], [1.0, -2.5, 65504.0]),
    "counts": ("I32", "i", [2, 2], [1, -2, 3, -4]),
}


def main():
    header = {"__metadata__": {"format": "pt", "epoch": "3"}}
    payload = b""
    for name, (dtype, code, shape, values) in TENSORS.items():
        data = struct.pack("<" + code * len(values), *values)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(payload), len(payload) + len(data)]}
        payload += data
    # bf16 has no struct code: take the top half of each float32.
    bf16_values = [1.0, -3.0, 0.15625]
    data = b"".join(struct.pack("<f", v)[2:] for v in bf16_values)
    header["bf16"] = {"dtype": "BF16", "shape": [3], "data_offsets": [len(payload), len(payload) + len(data)]}
    payload += data
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open(OUT, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + payload)
    print(f"wrote {OUT}: {len(TENSORS) + 1} tensors, {8 + len(text) + len(payload)} bytes")


if __name__ == "__main__":
    main()
