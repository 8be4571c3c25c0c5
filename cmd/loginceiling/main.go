// Command loginceiling is the loopback ceiling `make bench` calibrates the
// login generator against: a server that completes Postgres logins
// (cleartext password, SELECT 1) with no backend behind it. See
// internal/loginceiling and docs/bench.md.
//
//	loginceiling -addr 127.0.0.1:6564 [-password secret]
//
// It serves until SIGINT or SIGTERM, then prints how many logins it
// completed.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/pgtender/pgtender/internal/loginceiling"
)

func main() {
	flags := flag.NewFlagSet("loginceiling", flag.ContinueOnError)
	addr := flags.String("addr", "127.0.0.1:6564", "host:port to listen on")
	password := flags.String("password", "", "the only password accepted (empty: any)")
	if err := flags.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	server, err := loginceiling.Listen(*addr, *password)
	if err != nil {
		fmt.Fprintf(os.Stderr, "loginceiling: %v\n", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "loginceiling: listening on %s\n", server.Addr())
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	<-signals
	_ = server.Close()
	fmt.Fprintf(os.Stderr, "loginceiling: %d logins, %d SELECT 1\n", server.Logins(), server.Queries())
}
