// Package loginstorm is the login-storm load generator shipped as
// cmd/loginstorm. It is a Postgres client only: it imports nothing of
// pgtender's server side, so it measures pgtender (or PgBouncer, or Postgres)
// from the outside, as a reconnecting application fleet sees it.
package loginstorm

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// AbandonStage is where a deliberately abandoned login stops.
type AbandonStage string

const (
	AbandonNone AbandonStage = ""
	// AbandonStartup sends only the first bytes of the StartupMessage.
	AbandonStartup AbandonStage = "startup"
	// AbandonAuth sends the StartupMessage and leaves when asked for a password.
	AbandonAuth AbandonStage = "auth"
	// AbandonReady answers the password and leaves at AuthenticationOk,
	// before ReadyForQuery.
	AbandonReady AbandonStage = "ready"
)

// Target is one user/database/password combination a login can use.
type Target struct {
	User     string
	Database string
	// Password overrides the password list for this target when set.
	Password string
}

// Config is a parsed command line.
type Config struct {
	Address   string
	Targets   []Target
	Passwords []string
	// PasswordSwitchAfter rotates through Passwords on the clock; 0 picks
	// one at random for each login.
	PasswordSwitchAfter time.Duration
	WrongShare          float64
	Abandon             AbandonStage
	AbandonShare        float64
	Hold                int

	Workers        int
	Rate           float64
	MaxOutstanding int
	Duration       time.Duration
	Count          int64

	Deadline   time.Duration
	LateWindow time.Duration
	Query      string
	Graceful   bool

	GateOnTime       float64
	JSON             bool
	Progress         string
	MetricsURL       string
	MetricsNamespace string
	Seed             uint64
}

// OpenLoop reports whether logins are scheduled by the clock.
func (c Config) OpenLoop() bool { return c.Rate > 0 }

// errHelp is returned when -h was asked for; usage was already printed.
var errHelp = flag.ErrHelp

// ParseArgs parses the command line. Errors are usage errors (exit code 2).
func ParseArgs(args []string, stderr io.Writer) (Config, error) {
	var cfg Config
	var users, databases, passwords, password, targetsFile, abandon string
	flags := flag.NewFlagSet("loginstorm", flag.ContinueOnError)
	flags.SetOutput(stderr)
	flags.StringVar(&cfg.Address, "addr", "127.0.0.1:6432", "host:port of the pooler or server to log in to")
	flags.StringVar(&users, "user", "pgtender", "comma-separated user names, cycled per login")
	flags.StringVar(&databases, "database", "pgtender", "comma-separated database names, cycled per login")
	flags.StringVar(&password, "password", "", "the password (may contain commas); default $PGPASSWORD")
	flags.StringVar(&passwords, "passwords", "", "comma-separated password list for rotation storms")
	flags.DurationVar(&cfg.PasswordSwitchAfter, "password-switch-after", 0, "move to the next password of -passwords after this long (0: each login picks one at random)")
	flags.StringVar(&targetsFile, "targets", "", "file of targets, one per line: user database [password]; replaces -user/-database")
	flags.Float64Var(&cfg.WrongShare, "wrong", 0, "share of logins that send a wrong password (0..1); a 28P01/28000 refusal is their expected outcome")
	flags.StringVar(&abandon, "abandon", "", "stage at which a share of logins is abandoned: startup, auth or ready")
	flags.Float64Var(&cfg.AbandonShare, "abandon-share", 0.1, "share of logins abandoned when -abandon is set (0..1)")
	flags.IntVar(&cfg.Hold, "hold", 0, "idle logged-in connections to open before the run and hold until it ends")
	flags.IntVar(&cfg.Workers, "c", 64, "closed loop: workers, each starting a login when its last one ended")
	flags.Float64Var(&cfg.Rate, "rate", 0, "open loop: logins per second scheduled by the clock (0: closed loop)")
	flags.IntVar(&cfg.MaxOutstanding, "max-outstanding", 10000, "open loop: bound on logins in progress; a login that cannot start is 'skipped'")
	flags.DurationVar(&cfg.Duration, "duration", 10*time.Second, "how long to run (ignored when -n is set)")
	flags.Int64Var(&cfg.Count, "n", 0, "number of logins to plan (0: use -duration)")
	flags.DurationVar(&cfg.Deadline, "deadline", 5*time.Second, "one deadline for the whole login, connect and query included (as libpq's connect_timeout)")
	flags.DurationVar(&cfg.LateWindow, "late-window", 0, "keep waiting this long past -deadline to count late completions (0: give up at the deadline, as libpq does)")
	flags.StringVar(&cfg.Query, "query", "SELECT 1", "query to run once logged in (empty: none)")
	flags.BoolVar(&cfg.Graceful, "graceful", false, "close with FIN instead of RST (SO_LINGER 0); see docs about ephemeral ports")
	flags.Float64Var(&cfg.GateOnTime, "gate-ontime", 0.99, "share of planned logins that must complete on time for exit code 0")
	flags.BoolVar(&cfg.JSON, "json", false, "print the final summary as JSON")
	flags.StringVar(&cfg.Progress, "progress", "auto", "progress line every second: auto (when stdout is a terminal), always, never")
	flags.StringVar(&cfg.MetricsURL, "metrics", "", "URL of pgtender's /metrics to scrape before and after the run for reconciliation")
	flags.StringVar(&cfg.MetricsNamespace, "metrics-namespace", "", "prefix of pgtender's metric names (openmetrics_namespace), e.g. pgtender_")
	flags.Uint64Var(&cfg.Seed, "seed", 1, "seed for the wrong-password, abandon and password choices")
	if err := flags.Parse(args); err != nil {
		return cfg, err
	}
	if flags.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments: %q", flags.Args())
	}
	explicit := map[string]bool{}
	flags.Visit(func(f *flag.Flag) { explicit[f.Name] = true })

	if targetsFile != "" {
		if explicit["user"] || explicit["database"] {
			return cfg, errors.New("-targets replaces -user and -database; give one or the other")
		}
		targets, err := readTargets(targetsFile)
		if err != nil {
			return cfg, err
		}
		cfg.Targets = targets
	} else {
		userList, databaseList := splitList(users), splitList(databases)
		if len(userList) == 0 || len(databaseList) == 0 {
			return cfg, errors.New("-user and -database need at least one name each")
		}
		count := max(len(userList), len(databaseList))
		for i := range count {
			cfg.Targets = append(cfg.Targets, Target{User: userList[i%len(userList)], Database: databaseList[i%len(databaseList)]})
		}
	}
	switch {
	case password != "" && passwords != "":
		return cfg, errors.New("give -password or -passwords, not both")
	case passwords != "":
		cfg.Passwords = splitList(passwords)
	case password != "":
		cfg.Passwords = []string{password}
	default:
		cfg.Passwords = []string{os.Getenv("PGPASSWORD")}
	}
	cfg.Abandon = AbandonStage(abandon)
	switch cfg.Abandon {
	case AbandonNone, AbandonStartup, AbandonAuth, AbandonReady:
	default:
		return cfg, fmt.Errorf("-abandon %q: want startup, auth or ready", abandon)
	}
	if cfg.Abandon == AbandonNone {
		cfg.AbandonShare = 0
	}
	var problems []string
	check := func(ok bool, format string, args ...any) {
		if !ok {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	check(cfg.Address != "", "-addr is empty")
	check(cfg.WrongShare >= 0 && cfg.WrongShare <= 1, "-wrong %v: want 0..1", cfg.WrongShare)
	check(cfg.AbandonShare >= 0 && cfg.AbandonShare <= 1, "-abandon-share %v: want 0..1", cfg.AbandonShare)
	check(cfg.GateOnTime >= 0 && cfg.GateOnTime <= 1, "-gate-ontime %v: want 0..1", cfg.GateOnTime)
	check(cfg.Hold >= 0, "-hold %d: want >= 0", cfg.Hold)
	check(cfg.Workers > 0, "-c %d: want > 0", cfg.Workers)
	check(cfg.Rate >= 0, "-rate %v: want >= 0", cfg.Rate)
	check(cfg.MaxOutstanding > 0, "-max-outstanding %d: want > 0", cfg.MaxOutstanding)
	check(cfg.Count >= 0, "-n %d: want >= 0", cfg.Count)
	check(cfg.Count > 0 || cfg.Duration > 0, "-duration must be > 0 when -n is not set")
	check(cfg.Deadline > 0, "-deadline must be > 0")
	check(cfg.LateWindow >= 0, "-late-window must be >= 0")
	check(cfg.PasswordSwitchAfter >= 0, "-password-switch-after must be >= 0")
	check(cfg.Progress == "auto" || cfg.Progress == "always" || cfg.Progress == "never", "-progress %q: want auto, always or never", cfg.Progress)
	if len(problems) > 0 {
		return cfg, errors.New(strings.Join(problems, "; "))
	}
	return cfg, nil
}

func splitList(list string) []string {
	var out []string
	for item := range strings.SplitSeq(list, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// readTargets reads "user database [password]" lines; # starts a comment.
func readTargets(path string) ([]Target, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	var targets []Target
	scanner := bufio.NewScanner(file)
	for line := 1; scanner.Scan(); line++ {
		text, _, _ := strings.Cut(scanner.Text(), "#")
		fields := strings.Fields(text)
		switch len(fields) {
		case 0:
			continue
		case 2:
			targets = append(targets, Target{User: fields[0], Database: fields[1]})
		case 3:
			targets = append(targets, Target{User: fields[0], Database: fields[1], Password: fields[2]})
		default:
			return nil, fmt.Errorf("%s:%d: want 'user database [password]', got %d fields", path, line, len(fields))
		}
	}
	if err := scanner.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(targets) == 0 {
		return nil, fmt.Errorf("%s: no targets", path)
	}
	return targets, nil
}
