#!/usr/bin/env bash
# Runs docs/tutorial-kernels.md: every `$ command` of its ```console blocks, in order, in a scratch
# copy of examples/kernels/, with the emulation build's bin/ (mg-nvcc) first on PATH; each line the
# page shows under a command must appear in what the command printed (stdout and stderr; runs of
# spaces compared as one; a `...` line stands for lines not shown). A command that starts with
# `nvcc` runs only where the CUDA toolkit is installed; there the other example files are compiled
# with nvcc too, so every file of examples/kernels/ stays valid CUDA. Last, the build is installed
# into a scratch prefix and that prefix's bin/mg-nvcc builds and runs transpose.cu.
#
#   kernel_tutorial.sh <build-emu dir> <repository root>
set -uo pipefail
build="$1" root="$2"
doc="$root/docs/tutorial-kernels.md"
work="$(mktemp -d "${TMPDIR:-/tmp}/mg-tutorial.XXXXXX")"
trap 'rm -rf "$work"' EXIT
cp "$root"/examples/kernels/*.cu "$work/"
export PATH="$build/bin:$PATH"
nvcc_bin="$(command -v nvcc || true)"
[[ -z "$nvcc_bin" && -x /usr/local/cuda/bin/nvcc ]] && nvcc_bin=/usr/local/cuda/bin/nvcc

failures=0 commands=0
squeeze() { tr -s ' ' <<< "$1" | sed 's/^ //; s/ $//'; }
check_output() {  # $1: the command, $2: its output, rest: expected lines
  local cmd="$1" out="$2"; shift 2
  local squeezed; squeezed="$(squeeze "$out")"
  local line
  for line in "$@"; do
    [[ "$line" == "..." || -z "$line" ]] && continue
    if ! grep -qF -- "$(squeeze "$line")" <<< "$squeezed"; then
      printf 'FAILED: `%s` did not print:\n  %s\nit printed:\n%s\n\n' "$cmd" "$line" "$out"
      failures=$((failures + 1))
    fi
  done
}
run_command() {  # $1: the command, rest: expected lines
  local cmd="$1"; shift
  if [[ "$cmd" == nvcc* ]]; then
    if [[ -z "$nvcc_bin" ]]; then echo "skipped (no nvcc): $cmd"; return; fi
    cmd="$nvcc_bin${cmd#nvcc}"
  fi
  commands=$((commands + 1))
  echo "\$ $cmd"
  local out
  out="$(cd "$work" && bash -c "$cmd" 2>&1)"
  check_output "$cmd" "$out" "$@"
}

in_block=0 cmd="" expected=()
while IFS= read -r line; do
  if [[ "$line" == '```console' ]]; then in_block=1; cmd=""; expected=(); continue; fi
  ((in_block)) || continue
  if [[ "$line" == '```' || "$line" == '$ '* ]]; then
    [[ -n "$cmd" ]] && run_command "$cmd" "${expected[@]}"
    cmd="" expected=()
    if [[ "$line" == '```' ]]; then in_block=0; else cmd="${line#\$ }"; fi
    continue
  fi
  expected+=("$line")
done < "$doc"

if [[ -n "$nvcc_bin" ]]; then  # the files the page does not compile with nvcc itself
  for f in reduction matmul mistakes; do
    commands=$((commands + 1))
    if ! out="$(cd "$work" && "$nvcc_bin" -O2 -arch=sm_90 -c "$f.cu" -o "$f.gpu.o" 2>&1)"; then
      printf 'FAILED: nvcc does not compile %s.cu:\n%s\n' "$f" "$out"
      failures=$((failures + 1))
    fi
  done
fi
# The installed mg-nvcc, from a prefix of its own: the one step a user outside the project takes.
commands=$((commands + 1))
if ! out="$(cmake --install "$build" --prefix "$work/prefix" 2>&1)"; then
  printf 'FAILED: cmake --install %s:\n%s\n' "$build" "$out"
  failures=$((failures + 1))
elif ! out="$(cd "$work" && PATH="/usr/bin:/bin" "$work/prefix/bin/mg-nvcc" transpose.cu -o installed &&
             ./installed 2>&1)" || ! grep -q "transpose_padded: 0 of" <<< "$out"; then
  printf 'FAILED: the installed mg-nvcc (%s/prefix/bin/mg-nvcc):\n%s\n' "$work" "$out"
  failures=$((failures + 1))
fi

echo "kernel tutorial: $commands commands, $failures failures"
((commands >= 13 && failures == 0))
