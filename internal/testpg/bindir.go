package testpg

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// BinDirEnv names the environment variable that, when set, overrides where
// BinDir looks for the PostgreSQL server binaries. deploy/sandbox.sh honours it too.
const BinDirEnv = "PGTENDER_PG_BINDIR"

// serverBinaries are the programs a cluster needs; a candidate directory is
// accepted only if it holds all of them.
var serverBinaries = []string{"initdb", "pg_ctl", "postgres"}

// BinDir returns the directory holding initdb, pg_ctl and postgres. It looks,
// in order, at $PGTENDER_PG_BINDIR, `pg_config --bindir`, the highest version
// under /usr/lib/postgresql/*/bin (Debian and Ubuntu keep the server binaries
// there, off PATH), and the directory initdb on PATH resolves to. The answer
// is computed once per process.
func BinDir() (string, error) { return binDirOnce() }

var binDirOnce = sync.OnceValues(findBinDir)

func findBinDir() (string, error) {
	if dir := os.Getenv(BinDirEnv); dir != "" {
		if err := hasServerBinaries(dir); err != nil {
			return "", fmt.Errorf("testpg: $%s=%s: %w", BinDirEnv, dir, err)
		}
		return dir, nil
	}
	var tried []string
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dir := strings.TrimSpace(string(out))
		if hasServerBinaries(dir) == nil {
			return dir, nil
		}
		tried = append(tried, dir+" (pg_config --bindir)")
	}
	for _, dir := range debianBinDirs() {
		if hasServerBinaries(dir) == nil {
			return dir, nil
		}
		tried = append(tried, dir)
	}
	if path, err := exec.LookPath("initdb"); err == nil {
		// /usr/local/bin/initdb may be a symlink into the real bindir, which is
		// where postgres lives too.
		if real, err := filepath.EvalSymlinks(path); err == nil {
			path = real
		}
		dir := filepath.Dir(path)
		if hasServerBinaries(dir) == nil {
			return dir, nil
		}
		tried = append(tried, dir+" (PATH)")
	}
	msg := "testpg: PostgreSQL server binaries (initdb, pg_ctl, postgres) not found"
	if len(tried) > 0 {
		msg += "; tried " + strings.Join(tried, ", ")
	}
	return "", errors.New(msg + "; install the postgresql package or set $" + BinDirEnv)
}

// debianBinDirs lists /usr/lib/postgresql/<version>/bin, highest version first.
func debianBinDirs() []string {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	version := func(dir string) []int {
		var v []int
		for _, part := range strings.Split(filepath.Base(filepath.Dir(dir)), ".") {
			n, _ := strconv.Atoi(part)
			v = append(v, n)
		}
		return v
	}
	sort.Slice(dirs, func(i, j int) bool {
		a, b := version(dirs[i]), version(dirs[j])
		for k := 0; k < len(a) && k < len(b); k++ {
			if a[k] != b[k] {
				return a[k] > b[k]
			}
		}
		return len(a) > len(b)
	})
	return dirs
}

func hasServerBinaries(dir string) error {
	for _, name := range serverBinaries {
		info, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		if info.IsDir() || info.Mode()&0o111 == 0 {
			return fmt.Errorf("%s is not executable", filepath.Join(dir, name))
		}
	}
	return nil
}
