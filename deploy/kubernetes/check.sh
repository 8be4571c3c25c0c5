#!/usr/bin/env bash
# Checks the Kubernetes files without a cluster (deploy/kubernetes/*_test.go): helm lint and
# helm template of deploy/helm/pgtender with its default values and with every optional part
# on, every rendered object and every sidecar manifest strictly decoded into k8s.io/api types,
# and the rendered configuration through `pgtender --check-config`. CI runs it from .ci/run.
#
# helm is built from the Go module proxy into the user's cache directory the first time
# (minutes); later runs reuse it. -v prints helm lint's output (logged by TestHelmLint).
set -euo pipefail
cd "$(dirname "$0")"
command -v go >/dev/null || export PATH="$PATH:/usr/local/go/bin"
exec go test -count=1 -v -timeout 30m ./...
