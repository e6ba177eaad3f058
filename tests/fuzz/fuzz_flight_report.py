#!/usr/bin/env python3
"""Fuzzes scripts/flight-report's dump reader and analysis, in process, with coverage guidance.

    fuzz_flight_report.py --runs N [--seed S] [--corpus DIR] [--new DIR] [--crashes DIR]
    fuzz_flight_report.py --replay PATH...      every file once (a directory: its files)
    fuzz_flight_report.py --seeds DIR           writes the seed corpus (seed-* files)
    fuzz_flight_report.py --merge OUT DIR...    runs OUT's files, then copies into OUT the files
                                                of DIR... that add coverage (scripts/fuzz's merge)

An input is the bytes of up to 8 dumps separated by "\\n#MGFILE#\\n"; dump i is written as
rank-<i>.json into a scratch folder (tmpfs when there is one) and the report's main() runs on it,
as `scripts/flight-report DIR` would. A finding is any of:
  - an exception out of main() (a traceback: the report must refuse bad input with one line);
  - an exit status other than 0 (agree), 1 (culprit named), 2 (nothing found), 3 (bad input);
  - more than TIME_LIMIT_S seconds for one input (a hang: a loop over a range taken from a dump);
  - more than OUTPUT_LIMIT bytes printed for one input;
  - a MemoryError: the process runs under an address-space limit of MEMORY_LIMIT (RLIMIT_AS),
    while an input is at most MAX_INPUT bytes: the report must not grow with numbers it reads.
Findings are written to the crashes folder (named by their hash) and the run stops at the first.

Coverage: sys.settrace records the (previous line, line) arcs executed in flight-report's own
code, in one execution of --trace-every (tracing every line triples the cost of a run); an input
that adds an arc joins the corpus (and --new). Mutations are both structural (a
dump parsed, a field set to an awkward value: huge or negative integers, wrong types, deep
nesting, a duplicated or dropped entry or dump) and byte-level (flips, inserts, splices).
Python 3 standard library only, like the report.
"""
import argparse
import contextlib
import copy
import hashlib
import importlib.machinery
import importlib.util
import io
import json
import os
import random
import resource
import shutil
import signal
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPORT_PATH = os.path.join(HERE, "..", "..", "scripts", "flight-report")
SEPARATOR = b"\n#MGFILE#\n"
MAX_DUMPS = 8
MAX_INPUT = 64 << 10
TIME_LIMIT_S = 2.0
OUTPUT_LIMIT = 1 << 20
MEMORY_LIMIT = 1 << 30


def load_report():
    loader = importlib.machinery.SourceFileLoader("flight_report", REPORT_PATH)
    spec = importlib.util.spec_from_loader("flight_report", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


report = load_report()
REPORT_FILE = os.path.realpath(report.__file__)


class Finding(Exception):
    pass


class Hang(BaseException):  # not an Exception: the report's own handlers must not swallow it
    pass


class BoundedOutput(io.StringIO):
    def write(self, text):
        if self.tell() + len(text) > OUTPUT_LIMIT:
            raise Finding("printed more than %d bytes" % OUTPUT_LIMIT)
        return super().write(text)


# ---- coverage ------------------------------------------------------------------------------
arcs_seen = set()
arcs_now = set()


def _local_tracer(frame, event, arg):
    if event == "line":
        code = frame.f_code
        key = (code.co_firstlineno, frame.f_lineno)
        arcs_now.add((tracer_state.get(id(frame)), key))
        tracer_state[id(frame)] = key
    return _local_tracer


tracer_state = {}


def _global_tracer(frame, event, arg):
    if frame.f_code.co_filename == REPORT_FILE or os.path.realpath(frame.f_code.co_filename) == REPORT_FILE:
        return _local_tracer
    return None


# ---- one execution ---------------------------------------------------------------------------
def write_dumps(folder, data):
    for name in os.listdir(folder):
        os.unlink(os.path.join(folder, name))
    for i, part in enumerate(data.split(SEPARATOR)[:MAX_DUMPS]):
        with open(os.path.join(folder, "rank-%d.json" % i), "wb") as out:
            out.write(part)


def _on_alarm(signum, frame):
    raise Hang()


def execute(folder, data, trace):
    """Runs the report on `data`; returns the new arcs (a set), raises Finding."""
    write_dumps(folder, data[:MAX_INPUT])
    arcs_now.clear()
    tracer_state.clear()
    output = BoundedOutput()
    signal.setitimer(signal.ITIMER_REAL, TIME_LIMIT_S)
    if trace:
        sys.settrace(_global_tracer)
    try:
        with contextlib.redirect_stdout(output):
            status = report.main(["flight-report", folder])
    except Hang:
        raise Finding("took more than %.1f s" % TIME_LIMIT_S)
    except Finding:
        raise
    except MemoryError:
        raise Finding("MemoryError under a %d-byte address-space limit" % MEMORY_LIMIT)
    except BaseException as error:  # a traceback, SystemExit included
        raise Finding("%s: %s" % (type(error).__name__, error))
    finally:
        sys.settrace(None)
        signal.setitimer(signal.ITIMER_REAL, 0)
    if status not in (report.EXIT_AGREE, report.EXIT_CULPRIT, report.EXIT_NOTHING, report.EXIT_BAD_INPUT):
        raise Finding("exit status %r" % (status,))
    new = arcs_now - arcs_seen
    arcs_seen.update(arcs_now)
    return new


# ---- seeds -----------------------------------------------------------------------------------
def entry(group, sequence, op="allreduce(sum)", count=8, state="completed", caller="step", ident=None):
    return {"id": ident if ident is not None else sequence, "group": group, "sequence": sequence, "op": op,
            "dtype": "f32", "device": "cpu", "in_count": count, "out_count": count, "state": state,
            "queued_ns": 1000 * sequence, "started_ns": 1000 * sequence + 10,
            "finished_ns": 1000 * sequence + 500 if state == "completed" else 0, "caller": caller, "error": ""}


def dump(rank, world, entries, capacity=16, recorded=None):
    return {"rank": rank, "world_size": world, "host": "node0", "pid": 100 + rank, "reason": "timeout",
            "capacity": capacity, "recorded": len(entries) if recorded is None else recorded, "entries": entries}


def join(dumps):
    return SEPARATOR.join(json.dumps(d).encode() for d in dumps)


def seed_inputs():
    calls = [entry("world", s) for s in range(1, 6)]
    sub = [entry("world/1[0,2]", s, op="broadcast", ident=10 + s) for s in range(1, 3)]
    seeds = {
        "agree": join([dump(0, 2, calls), dump(1, 2, calls)]),
        "never-arrived": join([dump(0, 3, calls), dump(1, 3, calls[:3]), dump(2, 3, calls)]),
        "other-op": join([dump(0, 3, calls), dump(1, 3, calls[:2] + [entry("world", 3, op="allgather")] + calls[3:]),
                          dump(2, 3, calls)]),
        "unfinished": join([dump(0, 2, calls), dump(1, 2, calls[:4] + [entry("world", 5, state="started")])]),
        "subgroup": join([dump(0, 3, calls + sub), dump(1, 3, calls), dump(2, 3, calls + sub[:1])]),
        "wrapped": join([dump(0, 2, calls[2:], capacity=3, recorded=5), dump(1, 2, calls[1:], capacity=4,
                                                                             recorded=5)]),
        "missing-rank": join([dump(0, 4, calls), dump(2, 4, calls)]),
        # Issue 37, finding 5: the hostile dumps.
        "world-10-12": join([dump(0, 10 ** 12, calls)]),
        "sequence-10-15": join([dump(0, 2, calls + [entry("world", 10 ** 15)]), dump(1, 2, calls)]),
        "missing-key": json.dumps({k: v for k, v in dump(0, 1, calls).items() if k != "entries"}).encode(),
        "array": b"[1, 2, 3]",
        "rank-as-string": json.dumps(dict(dump(0, 1, calls), rank="0")).encode(),
        "deep-nesting": b"[" * 30000 + b"]" * 30000,
        "not-utf8": b'{"rank": "\xff"}',
    }
    return seeds


# ---- mutation ----------------------------------------------------------------------------------
AWKWARD = [0, -1, 1, 2, 3, 2 ** 31, 2 ** 62, 2 ** 63, 2 ** 64, 10 ** 12, 10 ** 15, 10 ** 400, -(10 ** 15), 1.5,
           float("nan"), float("inf"), "", "0", "world", "world/1[0,2]", "world[999999999999]", "world/2[0,1,1]",
           "x" * 300, None, True, False, [], {}, [[]], "queued", "started", "completed", "failed", "\u0000"]
TOKENS = [b"{", b"}", b"[", b"]", b":", b",", b'"', b"1e999", b"NaN", b"Infinity", b"-", b"\\ud800", b"null",
          b"999999999999999999999", b"\xff", SEPARATOR]


def paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from paths(v, prefix + (i,))


def structural(rng, dumps):
    """Edits `dumps` (freshly parsed by the caller, so edited in place)."""
    if not dumps:
        return dumps
    target = rng.randrange(len(dumps))
    choice = rng.randrange(8)
    if choice == 0:  # drop a dump, or duplicate one
        if rng.random() < 0.5 and len(dumps) > 1:
            del dumps[target]
        elif len(dumps) < MAX_DUMPS:
            dumps.append(copy.deepcopy(dumps[target]))
        return dumps
    d = dumps[target]
    all_paths = [p for p in paths(d) if p]
    if not all_paths:
        return dumps
    path = rng.choice(all_paths)
    parent = d
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    if choice in (1, 2, 3):
        parent[last] = copy.deepcopy(rng.choice(AWKWARD))
    elif choice == 4 and isinstance(parent, dict):
        del parent[last]
    elif choice == 5 and isinstance(parent, list):
        parent.insert(rng.randrange(len(parent) + 1), copy.deepcopy(parent[last]))
    elif choice == 6:  # nest deeper
        depth = rng.choice([2, 10, 1000, 100000])
        value = parent[last]
        for _ in range(min(depth, 200)):
            value = [value]
        parent[last] = value
    else:  # move an integer by a little
        if isinstance(parent[last], int) and not isinstance(parent[last], bool):
            parent[last] += rng.choice([-2, -1, 1, 2, 100])
    return dumps


def bytewise(rng, data, corpus):
    data = bytearray(data)
    choice = rng.randrange(6)
    at = rng.randrange(len(data) + 1)
    if choice == 0 and data:
        data[min(at, len(data) - 1)] ^= 1 << rng.randrange(8)
    elif choice == 1:
        data[at:at] = rng.choice(TOKENS)
    elif choice == 2 and data:
        del data[at:at + rng.randrange(1, 16)]
    elif choice == 3:
        del data[at:]
    elif choice == 4 and data:
        piece = data[at:at + rng.randrange(1, 64)]
        data[rng.randrange(len(data) + 1):0] = piece
    else:
        other = rng.choice(corpus)
        cut = rng.randrange(len(other) + 1)
        data = data[:at] + other[cut:]
    return bytes(data[:MAX_INPUT])


def mutate(rng, data, corpus):
    for _ in range(rng.randrange(1, 4)):
        parts = data.split(SEPARATOR)
        try:
            dumps = [json.loads(p) for p in parts]
        except (ValueError, RecursionError):
            dumps = None
        if dumps is not None and rng.random() < 0.6:
            try:
                data = join(structural(rng, dumps))
            except (ValueError, RecursionError, TypeError):
                pass  # json.dumps of nan/inf or deep nesting: keep the byte-level route
        else:
            data = bytewise(rng, data, corpus)
    return data[:MAX_INPUT]


# ---- driver ------------------------------------------------------------------------------------
def read_inputs(paths_given):
    out = []
    for path in paths_given:
        if os.path.isdir(path):
            out += [os.path.join(path, f) for f in sorted(os.listdir(path))]
        elif os.path.isfile(path):
            out.append(path)
        else:
            print("replay: %s does not exist, skipped" % path)
    return out


def save(folder, data, prefix=""):
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, prefix + hashlib.sha1(data).hexdigest())
    with open(path, "wb") as out:
        out.write(data)
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--corpus", action="append", default=[])
    parser.add_argument("--new", help="where inputs that add coverage are written")
    parser.add_argument("--crashes", help="where a finding's input is written")
    parser.add_argument("--replay", nargs="+")
    parser.add_argument("--seeds")
    parser.add_argument("--merge", nargs="+")
    parser.add_argument("--trace-every", type=int, default=4,
                        help="trace coverage in one execution of this many (tracing costs 3x)")
    args = parser.parse_args()
    if args.seeds:
        for name, data in seed_inputs().items():
            os.makedirs(args.seeds, exist_ok=True)
            with open(os.path.join(args.seeds, "seed-" + name), "wb") as out:
                out.write(data)
        return 0

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    signal.signal(signal.SIGALRM, _on_alarm)
    sys.setrecursionlimit(10000)
    scratch = tempfile.mkdtemp(prefix="mg_fuzz_flight_", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
    try:
        if args.replay:
            inputs = read_inputs(args.replay)
            if not inputs:
                print("replay: no inputs found (an empty corpus would make this test pass vacuously)")
                return 1
            start = time.time()
            for path in inputs:
                print("replay: %s" % path, flush=True)
                with open(path, "rb") as f:
                    data = f.read()
                try:
                    execute(scratch, data, trace=False)
                except Finding as finding:
                    print("FINDING: %s: %s" % (path, finding))
                    return 1
            print("replay: %d inputs, no finding, %.2f s" % (len(inputs), time.time() - start))
            return 0

        if args.merge:
            out, sources = args.merge[0], args.merge[1:]
            for path in read_inputs([out]):
                execute(scratch, open(path, "rb").read(), trace=True)
            kept = 0
            for path in read_inputs(sources):
                data = open(path, "rb").read()
                if execute(scratch, data, trace=True):
                    shutil.copy(path, os.path.join(out, os.path.basename(path)))
                    kept += 1
            print("merge: %d of %d inputs add coverage (%d arcs)" % (kept, len(read_inputs(sources)), len(arcs_seen)))
            return 0

        rng = random.Random(args.seed)
        corpus = [open(p, "rb").read() for p in read_inputs(args.corpus)] or list(seed_inputs().values())
        for data in corpus:
            execute(scratch, data, trace=True)
        start, last_print = time.time(), time.time()
        for run in range(1, args.runs + 1):
            data = mutate(rng, rng.choice(corpus), corpus)
            try:
                new = execute(scratch, data, trace=run % args.trace_every == 0)
            except Finding as finding:
                path = save(args.crashes or ".", data, "crash-")
                print("#%d FINDING: %s (input: %s)" % (run, finding, path))
                return 1
            if new:
                corpus.append(data)
                if args.new:
                    save(args.new, data)
            if time.time() - last_print > 30 or run == args.runs:
                last_print = time.time()
                print("#%d arcs: %d corpus: %d exec/s: %d" % (run, len(arcs_seen), len(corpus),
                                                               run / max(time.time() - start, 1e-9)), flush=True)
        print("stat::number_of_executed_units: %d" % args.runs)
        print("done: %d executions, %d arcs, %d corpus inputs, no finding, %.0f s"
              % (args.runs, len(arcs_seen), len(corpus), time.time() - start))
        return 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
