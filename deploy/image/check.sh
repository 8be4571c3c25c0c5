#!/bin/sh
# The container image's check, as CI runs it (there is no container engine
# on CI's machines): builds pgtender and loginstorm static from this
# checkout, builds the image of deploy/Dockerfile with go-containerregistry
# into an OCI archive, reads it back, checks its configuration and files
# against the Dockerfile, and runs the binary out of it (--version; as root,
# the entrypoint chrooted as the image's user, its HEALTHCHECK and its stop
# signal). -v prints the image's configuration as the test read it.
#
# This directory is a Go module of its own, so the pooler's module does not
# depend on go-containerregistry; the first run downloads it from the Go
# module proxy.
set -eu
cd "$(dirname "$0")"
export PATH="$PATH:/usr/local/go/bin"
go vet ./...
go test -count=1 -timeout 10m -v ./...
