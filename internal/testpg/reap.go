package testpg

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

var reapOnce sync.Once

// reapStale stops and removes the clusters of test processes that died
// without running their cleanups (a -timeout panic, SIGKILL, Ctrl-C), so that
// orphaned postmasters do not pile up across runs. It is best effort: a
// cluster it cannot stop (another user's) is left alone. A directory without
// owner.pid may be one another process is creating right now, so it is kept.
func reapStale(binDir string, owner *osUser) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, dir := range dirs {
		data, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil || pid == os.Getpid() || processAlive(pid) {
			continue
		}
		s := &Server{Dir: dir, DataDir: filepath.Join(dir, "data"), binDir: binDir, owner: owner, removed: true}
		s.mu.Lock()
		_ = s.destroyLocked(ShutdownImmediate)
		s.mu.Unlock()
	}
}

// processAlive reports whether pid exists; EPERM means it does, as someone else's.
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
