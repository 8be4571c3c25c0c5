//go:build !linux

package metrics

import (
	"errors"
	"syscall"
)

// readListenQueue is implemented on Linux only: other kernels do not report
// a listening socket's accept queue through TCP_INFO.
func readListenQueue(syscall.RawConn) (length, capacity uint32, err error) {
	return 0, 0, errors.New("the accept queue of a listening socket is read on Linux only")
}
