#!/usr/bin/env bash
# Usage: tools/buildprogress.sh MODULE_DIR OUT PKG [go build flags...]
#
# `go build -o OUT PKG` in MODULE_DIR with progress, for builds a person waits on (the first
# `make demo`, `make e2e`'s Jaeger): `go build -v` names each package as it compiles (cached
# ones are not named), and this counts them against the package's dependencies. On a terminal
# one line updates in place; elsewhere (CI logs) it prints one line before and one after.
# Compiler errors pass through unchanged, and the exit status is go build's.
set -euo pipefail
dir=$1 out=$2 pkg=$3
shift 3
go=${GO:-go}
total=$("$go" -C "$dir" list -deps "$pkg" | wc -l)
start=$SECONDS
if [ -t 2 ]; then tty=1; else tty=0; fi
echo "building $out: $pkg and its $total packages (a first build compiles them all: minutes on 2 cores; later builds reuse Go's cache)" >&2
"$go" -C "$dir" build -v -o "$out" "$@" "$pkg" 2>&1 | {
  n=0
  while IFS= read -r line; do
    if [[ $line =~ ^[A-Za-z0-9._~+/-]+$ ]]; then
      n=$((n + 1))
      if [ "$tty" = 1 ]; then printf '\r\033[K  compiled %d of at most %d packages: %s' "$n" "$total" "$line" >&2; fi
    else
      if [ "$tty" = 1 ]; then printf '\r\033[K' >&2; fi
      printf '%s\n' "$line" >&2
    fi
  done
  if [ "$tty" = 1 ]; then printf '\r\033[K' >&2; fi
  echo "$out: compiled $n of $total packages in $((SECONDS - start)) s" >&2
}
