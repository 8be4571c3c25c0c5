#!/usr/bin/env bash
# Runs every fuzz target (func Fuzz* in any package's tests) for FUZZTIME
# each, one after the other (make fuzz). A crasher is written to the
# package's testdata/fuzz/<target> and fails the run; `go test ./...`
# replays every saved input after that.
#
# Go 1.26's fuzzing coordinator can end a run that found nothing with
# "context deadline exceeded" at the end of -fuzztime, writing no input
# (golang/go#75804, fixed in Go 1.27). Such a run is reported as what it
# is and does not fail; any other failure, or one that wrote an input, does.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-10m}
log=$(mktemp)
files() { if [[ -d $1 ]]; then ls "$1" | wc -l; else echo 0; fi; }
trap 'rm -f "$log"' EXIT

for pkg in $($GO list ./...); do
  dir=$($GO list -f '{{.Dir}}' "$pkg")
  for target in $(cat "$dir"/*_test.go 2>/dev/null | sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p'); do
    echo "fuzz: $pkg $target for $FUZZTIME"
    corpus=$dir/testdata/fuzz/$target
    before=$(files "$corpus")
    # -timeout 0: the test binary's default 10-minute timeout would end a
    # 10-minute run as it finishes.
    if $GO test -run '^$' -fuzz "^$target\$" -fuzztime "$FUZZTIME" -timeout 0 "$pkg" >"$log" 2>&1; then
      grep 'execs:' "$log" | tail -1 || true
      continue
    fi
    after=$(files "$corpus")
    if ((after == before)) && grep -q '^    context deadline exceeded$' "$log"; then
      grep 'execs:' "$log" | tail -1 || true
      echo "fuzz: $target: the coordinator ended with 'context deadline exceeded' and wrote no failing input (golang/go#75804): not a crash"
      continue
    fi
    cat "$log"
    exit 1
  done
done
