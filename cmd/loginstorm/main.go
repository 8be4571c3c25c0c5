// Command loginstorm is a login-storm load generator for Postgres poolers:
// complete logins in closed or open loop, with failures counted by class and
// reconciled against pgtender's /metrics. See docs/loginstorm.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/pgtender/pgtender/internal/loginstorm"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := loginstorm.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
