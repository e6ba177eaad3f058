#!/usr/bin/env python3
"""Runs `bench_kernels --profile --profile-sites` on the memory family (quick sizes) and checks what
a reader of its table and JSON relies on (docs/performance-model.md, "bench_kernels --profile"):

  * every row has a predicted time and a binding limit;
  * instructions are counted by default: with nvcc configured, every launch of every row was
    counted from its PTX; without it, none was, and each launch said why;
  * the host synchronisations inside a call are priced: the cross-entropy forward copies its count
    of rows back (one wait), no other memory row waits, and a row's prediction holds 10 us per wait;
  * --profile-sites prints every limit of every launch, largest first: for a row of one launch the
    first limit named is the row's binding one.

Usage: check_bench_profile.py <bench_kernels> <nvcc configured: 0|1>
Python 3 standard library only.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

HOST_SYNC_S = 10e-6  # gpu_spec.cpp: host_sync_s of the H200


def main():
    bench, have_nvcc = sys.argv[1], sys.argv[2] == "1"
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "profile.json")
        run = subprocess.run([bench, "--profile-sites", "--family", "memory", "--quick", "--json", path],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
        if run.returncode != 0:
            print(run.stdout[-4000:])
            print("FAILED: bench_kernels exited with %d" % run.returncode)
            return 1
        report = json.load(open(path))
    out = run.stdout

    if report.get("instructions_counted") is not True:
        failures.append("the JSON says instructions_counted = %r; counting is the default" %
                        report.get("instructions_counted"))
    limits = [line.split(":", 1)[1].strip() for line in out.splitlines()
              if line.strip().startswith("limits (predicted, us):")]
    rows = report["rows"]
    if not rows:
        failures.append("no rows in the JSON")
    next_limit = 0
    for r in rows:
        name, p = "%s %s" % (r["kernel"], r["shape"]), r["profile"]
        launches = int(p["launches"])
        if not p["predicted_seconds"] > 0 or not p["binding"]:
            failures.append("%s: no prediction (%r, %r)" % (name, p["predicted_seconds"], p["binding"]))
        counted = p["instruction_counted_launches"]
        if have_nvcc and counted != launches:
            failures.append("%s: %d of %d launches counted with nvcc configured" % (name, counted, launches))
        if not have_nvcc and counted != 0:
            failures.append("%s: %d launches counted without nvcc" % (name, counted))
        syncs = p["host_syncs"]
        want = 1 if r["kernel"] == "cross_entropy fwd" else 0
        if syncs != want:
            failures.append("%s: %r host syncs, expected %d" % (name, syncs, want))
        if p["predicted_seconds"] < syncs * HOST_SYNC_S:
            failures.append("%s: predicted %.3g s holds less than its %d host syncs" %
                            (name, p["predicted_seconds"], syncs))
        row_limits = limits[next_limit:next_limit + launches]
        next_limit += launches
        if len(row_limits) != launches:
            failures.append("%s: %d limit lines for %d launches" % (name, len(row_limits), launches))
            continue
        for text in row_limits:
            times = [float(t) for t in re.findall(r" (\d+\.\d+)(?=,|;)", " " + text.split(";")[0])]
            if times != sorted(times, reverse=True):
                failures.append("%s: limits not largest first: %s" % (name, text))
        if launches == 1 and not row_limits[0].startswith(p["binding"] + " "):
            failures.append("%s: binds on %s, but its limits start %s" % (name, p["binding"], row_limits[0][:40]))
    if next_limit != len(limits):
        failures.append("%d limit lines for %d launches" % (len(limits), next_limit))
    if not have_nvcc and "not counted" not in out:
        failures.append("without nvcc no launch said why its instructions were not counted")

    for f in failures:
        print("FAILED: " + f)
    print("%d rows, %d launches' limits checked, instructions %s: %s" %
          (len(rows), next_limit, "counted" if have_nvcc else "not counted (no nvcc)",
           "FAILED" if failures else "OK"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
