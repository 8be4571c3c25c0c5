// Command image builds pgtender's container image without a container
// engine: the steps of deploy/Dockerfile, in Go, with go-containerregistry
// (https://github.com/google/go-containerregistry). It builds the two static
// binaries from the checkout (CGO_ENABLED=0, -trimpath), puts them and a CA
// bundle in one layer on an empty base, sets the run configuration the
// Dockerfile sets, and writes an OCI image layout in a tar archive:
//
//	cd deploy/image && go run . -o pgtender-oci.tar -version 1.2.0
//	skopeo copy oci-archive:pgtender-oci.tar docker://registry.example/pgtender:1.2.0
//
// It is a module of its own so that the pooler's module does not depend on
// go-containerregistry. check.sh runs its test, which is what CI runs.
package main

import (
	"context"
	"debug/buildinfo"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"time"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	flags := flag.NewFlagSet("image", flag.ContinueOnError)
	repo := flags.String("repo", "../..", "the pgtender checkout to build from")
	out := flags.String("o", "pgtender-oci.tar", "where to write the OCI archive")
	version := flags.String("version", "dev", "the version: pgtender's -X main.version, the image's label and ref name")
	arch := flags.String("arch", runtime.GOARCH, "GOARCH of the binaries and the image")
	caCertificates := flags.String("ca-certificates", "/etc/ssl/certs/ca-certificates.crt", "the CA bundle to ship (Debian's ca-certificates, as in the Dockerfile's golang builder)")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	binDir, err := os.MkdirTemp("", "pgtender-image-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(binDir)
	opts, err := BuildBinaries(ctx, *repo, binDir, *version, *arch)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	opts.CACertificates = *caCertificates
	img, err := Build(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "build image:", err)
		return 1
	}
	if err := WriteOCIArchive(img, *out, opts.Version); err != nil {
		fmt.Fprintln(os.Stderr, "write", *out+":", err)
		return 1
	}
	digest, err := img.Digest()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("%s: pgtender %s (commit %s) %s/%s, %s\n", *out, opts.Version, opts.Commit, "linux", opts.Architecture, digest)
	return 0
}

// BuildBinaries builds cmd/pgtender and cmd/loginstorm of the checkout at
// repo into dir, as the Dockerfile's build stage does: static
// (CGO_ENABLED=0, so the net package's pure-Go resolver and no libc),
// -trimpath, the version by -X. The commit comes from the checkout
// (-buildvcs=true, since GOFLAGS may turn stamping off); it and the
// commit's time are read back from the binary for the labels and the
// image's creation time (SOURCE_DATE_EPOCH wins,
// https://reproducible-builds.org/docs/source-date-epoch/).
func BuildBinaries(ctx context.Context, repo, dir, version, arch string) (Options, error) {
	opts := Options{
		Pgtender:     filepath.Join(dir, "pgtender"),
		Loginstorm:   filepath.Join(dir, "loginstorm"),
		Version:      version,
		Architecture: arch,
		Created:      time.Unix(0, 0).UTC(),
	}
	for _, b := range []struct{ pkg, out, ldflags string }{
		{"./cmd/pgtender", opts.Pgtender, "-s -w -X main.version=" + version},
		{"./cmd/loginstorm", opts.Loginstorm, "-s -w"},
	} {
		build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=true", "-ldflags", b.ldflags, "-o", b.out, b.pkg)
		build.Dir = repo
		build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
		if out, err := build.CombinedOutput(); err != nil {
			return opts, fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out)
		}
	}
	info, err := buildinfo.ReadFile(opts.Pgtender)
	if err != nil {
		return opts, fmt.Errorf("read the build information of %s: %w", opts.Pgtender, err)
	}
	opts.Commit = "unknown"
	for _, setting := range info.Settings {
		switch setting.Key {
		case "vcs.revision":
			opts.Commit = setting.Value
		case "vcs.time":
			if t, err := time.Parse(time.RFC3339, setting.Value); err == nil {
				opts.Created = t.UTC()
			}
		}
	}
	if epoch := os.Getenv("SOURCE_DATE_EPOCH"); epoch != "" {
		seconds, err := strconv.ParseInt(epoch, 10, 64)
		if err != nil {
			return opts, fmt.Errorf("SOURCE_DATE_EPOCH=%q: %w", epoch, err)
		}
		opts.Created = time.Unix(seconds, 0).UTC()
	}
	return opts, nil
}
