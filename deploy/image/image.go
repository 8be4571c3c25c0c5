package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// What the image runs, and as whom. deploy/Dockerfile says the same (its
// USER, EXPOSE, STOPSIGNAL, HEALTHCHECK, ENTRYPOINT and CMD), and the test
// compares the two.
const (
	// user is numeric: the image has no /etc/passwd to look a name up in.
	// 65532 is the "nonroot" user of the distroless images, which
	// Kubernetes manifests often name in runAsUser.
	user       = "65532:65532"
	stopSignal = "SIGTERM" // pgtender drains on it
	// healthURL assumes openmetrics_port = 9930, as pgdog.toml.example sets.
	healthURL = "http://127.0.0.1:9930/healthz"
)

var (
	entrypoint   = []string{"/pgtender"}
	cmd          = []string{"--config", "/etc/pgtender/pgdog.toml", "--users", "/etc/pgtender/users.toml"}
	exposedPorts = []string{"6432/tcp", "9930/tcp"}
	healthcheck  = &v1.HealthConfig{
		Test:        []string{"CMD", "/pgtender", "--healthcheck", healthURL},
		Interval:    10 * time.Second,
		Timeout:     3 * time.Second,
		StartPeriod: 5 * time.Second,
		Retries:     3,
	}
)

// The files of the image's one layer, with the Dockerfile's COPY
// destinations.
const (
	pgtenderPath   = "/pgtender"
	loginstormPath = "/loginstorm"
	// Go's crypto/x509 reads the system roots from here on Linux; without
	// it tls_verify = "verify_full" with no tls_server_ca_certificate
	// could verify nothing.
	caCertificatesPath = "/etc/ssl/certs/ca-certificates.crt"
)

// Options are the inputs of one image.
type Options struct {
	Pgtender       string // path of the static pgtender binary
	Loginstorm     string // path of the static loginstorm binary
	CACertificates string // path of a PEM bundle of CA certificates
	Version        string // the image's version label, and the layout's ref name
	Commit         string // the image's revision label
	Architecture   string // GOARCH of the binaries
	// Created stamps the config and the files' modification times; a fixed
	// time (SOURCE_DATE_EPOCH) makes the same binaries give the same image.
	Created time.Time
}

// Config is the image's run configuration.
func Config(opts Options) v1.Config {
	ports := map[string]struct{}{}
	for _, port := range exposedPorts {
		ports[port] = struct{}{}
	}
	return v1.Config{
		User:         user,
		Entrypoint:   append([]string(nil), entrypoint...),
		Cmd:          append([]string(nil), cmd...),
		ExposedPorts: ports,
		StopSignal:   stopSignal,
		Healthcheck:  healthcheck,
		Labels: map[string]string{
			// https://github.com/opencontainers/image-spec/blob/main/annotations.md
			"org.opencontainers.image.title":       "pgtender",
			"org.opencontainers.image.description": "PostgreSQL connection pooler",
			"org.opencontainers.image.version":     opts.Version,
			"org.opencontainers.image.revision":    opts.Commit,
		},
	}
}

// Build makes the image: no base (scratch), one layer with the two
// binaries and the CA bundle, the run configuration of Config, in OCI
// media types.
func Build(opts Options) (v1.Image, error) {
	layerTar, err := layerArchive(opts)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History:   v1.History{Created: v1.Time{Time: opts.Created}, CreatedBy: "deploy/image: COPY pgtender loginstorm ca-certificates.crt", Comment: "the steps of deploy/Dockerfile"},
	})
	if err != nil {
		return nil, fmt.Errorf("append layer: %w", err)
	}
	file, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	file = file.DeepCopy()
	file.OS = "linux"
	file.Architecture = opts.Architecture
	file.Created = v1.Time{Time: opts.Created}
	file.Config = Config(opts)
	return mutate.ConfigFile(img, file)
}

// layerArchive is the layer's tar: the directories above each file, then
// the files, owned by root and readable by all (the image runs as 65532).
func layerArchive(opts Options) ([]byte, error) {
	files := []struct {
		src, dst string
		mode     int64
	}{
		{opts.Pgtender, pgtenderPath, 0o755},
		{opts.Loginstorm, loginstormPath, 0o755},
		{opts.CACertificates, caCertificatesPath, 0o644},
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, f := range files {
		data, err := os.ReadFile(f.src)
		if err != nil {
			return nil, err
		}
		name := strings.TrimPrefix(f.dst, "/")
		var parents []string
		for dir := filepath.Dir(name); dir != "."; dir = filepath.Dir(dir) {
			parents = append([]string{dir}, parents...)
		}
		for _, dir := range parents {
			if dirs[dir] {
				continue
			}
			dirs[dir] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir + "/", Mode: 0o755, ModTime: opts.Created, Format: tar.FormatPAX}); err != nil {
				return nil, err
			}
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: f.mode, Size: int64(len(data)), ModTime: opts.Created, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// refNameAnnotation names an image in an OCI layout's index.json
// (https://github.com/opencontainers/image-spec/blob/main/image-layout.md).
const refNameAnnotation = "org.opencontainers.image.ref.name"

// WriteOCIArchive writes img as an OCI image layout in a tar archive at
// path, the format of skopeo's and podman's oci-archive: transport
// (`skopeo copy oci-archive:pgtender.tar docker://registry/pgtender:tag`).
// tag becomes the layout's ref name.
func WriteOCIArchive(img v1.Image, path, tag string) error {
	dir, err := os.MkdirTemp("", "pgtender-oci-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	l, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	if err := l.AppendImage(img, layout.WithAnnotations(map[string]string{refNameAnnotation: tag})); err != nil {
		return err
	}
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(out)
	walkErr := filepath.WalkDir(dir, func(file string, d fs.DirEntry, err error) error {
		if err != nil || file == dir {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		header, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, file)
		header.Name = filepath.ToSlash(rel)
		if d.IsDir() {
			header.Name += "/"
		}
		// The same image gives the same archive: no time, owner or mode
		// of the temporary directory goes into it.
		header.ModTime = time.Unix(0, 0)
		header.Uid, header.Gid, header.Uname, header.Gname = 0, 0, "", ""
		header.Mode = 0o644
		if d.IsDir() {
			header.Mode = 0o755
		}
		if err := tw.WriteHeader(header); err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		f, err := os.Open(file)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err := tw.Close(); err != nil && walkErr == nil {
		walkErr = err
	}
	if err := out.Close(); err != nil && walkErr == nil {
		walkErr = err
	}
	return walkErr
}
