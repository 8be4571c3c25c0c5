package pooler

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"net"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/pgtender/pgtender/auth"
	"github.com/pgtender/pgtender/config"
)

// maxConcurrentServerConnects bounds how many server connections pgtender
// opens at once, across all pools, so that a login storm against cold pools
// does not fork hundreds of Postgres backends in the same instant. Each
// pool is bounded by its size as well.
const maxConcurrentServerConnects = 16

// maxConcurrentCancels bounds the CancelRequests pgtender forwards at once:
// each costs Postgres a connection (a backend fork) of its own. Cancels
// take no login slot and are never shed with logins: under overload they
// are what relieves Postgres.
const maxConcurrentCancels = 16

// maintenanceInterval is how often idle and old server connections are
// closed and pools are topped up to min_pool_size.
const maintenanceInterval = time.Second

// Pooler is the connection pooler: listeners, client sessions and pools.
// Create it with New, then Listen, Serve and finally Shutdown.
type Pooler struct {
	log      *zap.Logger
	recorder LoginRecorder
	registry *auth.Registry
	// verify is p.verifyPassthrough, made once: a method value written at
	// each Authenticate call would escape and allocate per login.
	verify auth.VerifyFunc
	// clientTLS serves the certificate of the running state (tls.go).
	clientTLS *tls.Config

	// state is the running configuration with what was derived from it;
	// Reload replaces it as a whole.
	state atomic.Pointer[runtimeState]

	poolsMu sync.Mutex
	pools   map[poolKey]*Pool
	// poolsView is a copy of pools that is never changed in place, stored
	// again under poolsMu after each change (publishPoolsLocked), so that
	// a login finds its pool without taking poolsMu.
	poolsView atomic.Pointer[map[poolKey]*Pool]
	// paused is what the console's PAUSE holds (control.go), guarded by
	// poolsMu so that a pool made while a pause is on starts paused.
	paused pauseSet

	targetsMu sync.Mutex
	targets   map[string]*serverTarget // by host:port (target.go)
	// connects counts the server connects running (openServer), waited
	// for at shutdown. A connect may start from a goroutine nothing else
	// tracks (a passthrough verification's flight), so connectsMu orders
	// each Add before Shutdown's Wait, after which connectsClosed refuses
	// new ones.
	connectsMu     sync.Mutex
	connectsClosed bool
	connects       sync.WaitGroup

	healthMu       sync.Mutex // guards databaseHealth
	databaseHealth map[string]*databaseHealth

	sessionsMu sync.Mutex
	sessions   map[uint32]*session // every session, by its BackendKeyData process id
	keys       keySource           // draws those process ids and secrets; guarded by sessionsMu

	cancels          cancelCounters
	clientTimeouts   clientTimeoutCounters
	protocolErrors   clientProtocolCounters
	unknownCancelLog logSampler // CancelRequests whose key matched no client

	listeners    []*net.TCPListener
	connectSlots chan struct{} // semaphore of maxConcurrentServerConnects
	cancelSlots  chan struct{} // semaphore of maxConcurrentCancels
	loginSlots   *loginSlots   // login admission control (admission.go)
	// parker holds idle clients without a goroutine (park.go); nil before
	// Serve, or when its epoll set could not be made. Set by Serve before
	// the accept loops start.
	parker atomic.Pointer[parker]
	// parkTuning is the parker's, for tests; zero fields take the
	// defaults (park.go). Read by Serve.
	parkTuning parkTuning
	// inlineReadBudget is readServerInline's budget, for tests: zero takes
	// the default (relay.go), and a negative one relays every reply on a
	// reader goroutine. Set before Serve.
	inlineReadBudget time.Duration

	clientCount      atomic.Int64
	draining         atomic.Bool
	unready          atomic.Bool     // StopReadiness was called: Ready is false, serving goes on
	notAccepting     atomic.Bool     // StopAccepting was called: the listeners are closed, serving goes on
	done             chan struct{}   // closed by Shutdown; stops background loops
	ctx              context.Context // canceled by Shutdown; bounds background server connects
	cancel           context.CancelFunc
	shutdownOnce     sync.Once
	wg               sync.WaitGroup // every goroutine the pooler starts
	serveStarted     atomic.Bool
	effectiveBacklog int

	reloadMu sync.Mutex // serialises Reload
	// disabled are the databases DISABLEd on the console (control.go):
	// replaced, never changed in place; disabledMu serialises writers.
	disabled     atomic.Pointer[map[string]bool]
	disabledMu   sync.Mutex
	consoleHooks atomic.Pointer[ConsoleHooks] // SetConsoleHooks; nil: none
	// shedCounts count the logins admission control refused, by reason
	// (SHOW LOGINS; the metrics count them under logins_total{result="shed"}).
	shedCounts shedCounters
	// consoleStats is SHOW STATS's averages (consolestats.go), replaced
	// every stats_period.
	consoleStats atomic.Pointer[statsWindow]
}

// runtimeState is one immutable configuration generation.
type runtimeState struct {
	cfg *config.Config
	// credentials of users.toml users, derived once per load so that a
	// SCRAM login costs HMACs rather than PBKDF2.
	credentials map[auth.Key]*auth.Credentials
	// certificate is the client-facing TLS certificate; nil: no client TLS.
	certificate *tls.Certificate
	// serverCAs verify Postgres's certificate under verify_ca and
	// verify_full; nil: the system's roots.
	serverCAs *x509.CertPool
	// adminCredentials check the admin console's password; nil when
	// [admin] password is empty and the console is closed.
	adminCredentials *auth.Credentials
}

// New returns a pooler for cfg, which must come from config.Load. log and
// recorder may be nil.
func New(cfg *config.Config, log *zap.Logger, recorder LoginRecorder) (*Pooler, error) {
	if log == nil {
		log = zap.NewNop()
	}
	if recorder == nil {
		recorder = nopRecorder{}
	}
	state, err := newRuntimeState(cfg)
	if err != nil {
		return nil, err
	}
	p := &Pooler{
		log:      log,
		recorder: recorder,
		registry: auth.NewRegistry(cfg.General.PassthroughAuth,
			auth.WithReverifyInterval(cfg.General.PassthroughReverifyInterval.Duration())),
		pools:          make(map[poolKey]*Pool),
		sessions:       make(map[uint32]*session),
		databaseHealth: make(map[string]*databaseHealth),
		targets:        make(map[string]*serverTarget),
		connectSlots:   make(chan struct{}, maxConcurrentServerConnects),
		cancelSlots:    make(chan struct{}, maxConcurrentCancels),
		done:           make(chan struct{}),
		// At most about one line a second.
		unknownCancelLog: logSampler{interval: time.Second},
	}
	p.verify = p.verifyPassthrough
	p.clientTLS = p.clientTLSConfig()
	p.loginSlots = newLoginSlots(cfg.General.MaxLoginsInProgress)
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.state.Store(state)
	return p, nil
}

func newRuntimeState(cfg *config.Config) (*runtimeState, error) {
	state := &runtimeState{cfg: cfg, credentials: make(map[auth.Key]*auth.Credentials)}
	var err error
	if state.certificate, err = cfg.General.LoadCertificate(); err != nil {
		return nil, err
	}
	if state.serverCAs, err = cfg.General.LoadServerCA(); err != nil {
		return nil, err
	}
	if cfg.Admin.Password != "" {
		if state.adminCredentials, err = auth.NewCredentials(cfg.Admin.User, cfg.Admin.Password); err != nil {
			return nil, fmt.Errorf("[admin] password: %w", err)
		}
	}
	if cfg.General.PassthroughAuth.Enabled() {
		return state, nil
	}
	for _, user := range cfg.Users {
		if user.Password == "" {
			continue
		}
		creds, err := auth.NewCredentials(user.Name, user.Password)
		if err != nil {
			return nil, fmt.Errorf("users.toml: user %q: %w", user.Name, err)
		}
		state.credentials[auth.Key{User: user.Name, Database: user.Database}] = creds
	}
	return state, nil
}

// Listen opens the listening sockets. It is separate from Serve so that a
// caller knows the address (and can fail early) before serving.
func (p *Pooler) Listen() error {
	general := p.state.Load().cfg.General
	listeners, effective, err := listenWorkers(general.Host, general.Port, general.Workers, general.ListenBacklog)
	if err != nil {
		return err
	}
	p.listeners = listeners
	p.effectiveBacklog = effective
	fields := []zap.Field{
		zap.String("address", listeners[0].Addr().String()),
		zap.Int("workers", len(listeners)),
		zap.Int("listen_backlog", general.ListenBacklog),
		zap.Int("effective_backlog", effective),
	}
	if effective < general.ListenBacklog {
		p.log.Warn("listen_backlog capped by net.core.somaxconn; raise the sysctl to use it", fields...)
	} else {
		p.log.Info("listening", fields...)
	}
	state := p.state.Load()
	if state.adminCredentials == nil {
		p.log.Info("the admin console is closed: [admin] password is not set")
	} else {
		p.log.Info("admin console open", zap.String("database", state.cfg.Admin.Name), zap.String("user", state.cfg.Admin.User))
	}
	return nil
}

// Addr is the address the pooler listens on (after Listen).
func (p *Pooler) Addr() net.Addr { return p.listeners[0].Addr() }

// EffectiveBacklog is the accept-queue size each listening socket got.
func (p *Pooler) EffectiveBacklog() int { return p.effectiveBacklog }

// Serve runs the accept loops and background maintenance until Shutdown,
// then returns ErrServerClosed.
func (p *Pooler) Serve() error {
	if len(p.listeners) == 0 {
		return errors.New("pooler: Serve called before Listen")
	}
	p.serveStarted.Store(true)
	if pk, err := newParker(p, p.parkTuning); err != nil {
		p.log.Warn("idle clients will not be parked: the parker's epoll set could not be made", zap.Error(err))
	} else {
		p.parker.Store(pk)
		p.wg.Add(1)
		go pk.run()
	}
	p.createConfiguredPools()
	for i, l := range p.listeners {
		p.wg.Add(1)
		go p.acceptLoop(l, i)
	}
	p.wg.Add(4)
	go p.maintenanceLoop()
	go p.statsLoop()
	go p.healthLoop()
	go p.acceptQueueSizer()
	<-p.done
	return ErrServerClosed
}

// createConfiguredPools creates the pools of users.toml users up front, so
// that min_pool_size warms them before the first client arrives.
// Passthrough pools are created when their first password is verified.
func (p *Pooler) createConfiguredPools() {
	cfg := p.state.Load().cfg
	if cfg.General.PassthroughAuth.Enabled() {
		return
	}
	for _, user := range cfg.Users {
		p.poolFor(user.Name, user.Database)
	}
}

// Config returns the running configuration (the last one loaded or
// reloaded); the caller must not modify it.
func (p *Pooler) Config() *config.Config { return p.state.Load().cfg }

// Draining reports whether Shutdown has begun.
func (p *Pooler) Draining() bool { return p.draining.Load() }

// StopAccepting closes the listening sockets, so that new connections are
// refused by the kernel, and turns readiness off, while the clients logged
// in are served as before: SHUTDOWN WAIT_FOR_CLIENTS, whose caller shuts
// down once ClientCount is 0. Shutdown may follow at any time.
func (p *Pooler) StopAccepting() {
	p.notAccepting.Store(true)
	for _, l := range p.listeners {
		l.Close()
	}
}

// Shutdown drains the pooler: it stops accepting, ends idle client
// sessions, lets transactions in flight reach their end, and when ctx ends
// closes whatever is left. It returns once every goroutine has ended.
func (p *Pooler) Shutdown(ctx context.Context) error {
	p.shutdownOnce.Do(func() {
		p.draining.Store(true)
		for _, l := range p.listeners {
			l.Close()
		}
		close(p.done)
		p.cancel()
		if pk := p.parker.Load(); pk != nil {
			pk.stop() // parked sessions are ended below (closeSocket resumes them)
		}
	})
	for _, s := range p.sessionList() {
		s.endIfIdle()
	}
	ticker := time.NewTicker(10 * time.Millisecond)
	defer ticker.Stop()
	var err error
wait:
	for p.sessionCount() > 0 {
		select {
		case <-ctx.Done():
			err = ctx.Err()
			for _, s := range p.sessionList() {
				s.forceClose()
			}
			break wait
		case <-ticker.C:
			// Sessions that finished their transaction since the last
			// pass are idle now.
			for _, s := range p.sessionList() {
				s.endIfIdle()
			}
		}
	}
	p.wg.Wait()
	p.registry.Close() // ends background re-verifications
	p.connectsMu.Lock()
	p.connectsClosed = true
	p.connectsMu.Unlock()
	p.connects.Wait() // shutdown canceled p.ctx, which ends them
	p.poolsMu.Lock()
	for key, pool := range p.pools {
		pool.close()
		delete(p.pools, key)
	}
	p.publishPoolsLocked()
	p.poolsMu.Unlock()
	return err
}

func (p *Pooler) sessionList() []*session {
	return p.appendSessions(nil)
}

// appendSessions appends every session to list and returns it.
func (p *Pooler) appendSessions(list []*session) []*session {
	p.sessionsMu.Lock()
	defer p.sessionsMu.Unlock()
	list = slices.Grow(list, len(p.sessions))
	for _, s := range p.sessions {
		list = append(list, s)
	}
	return list
}

func (p *Pooler) sessionCount() int {
	p.sessionsMu.Lock()
	defer p.sessionsMu.Unlock()
	return len(p.sessions)
}

// serveConn runs one client session on its own goroutine. The p.wg count
// the accept loop added for it is the session's, not the goroutine's: a
// session that parks keeps it until it ends (session.endUnlessParked).
func (p *Pooler) serveConn(conn *net.TCPConn) {
	s := newSession(p, conn)
	p.registerSession(s)
	p.clientCount.Add(1)
	s.serve()
}

// registerSession gives s its BackendKeyData, a process id no other live
// session has and a secret (cancel.go), and adds it to p.sessions.
func (p *Pooler) registerSession(s *session) {
	p.sessionsMu.Lock()
	defer p.sessionsMu.Unlock()
	for {
		s.processID = p.keys.processID()
		if _, taken := p.sessions[s.processID]; !taken {
			break
		}
	}
	s.secret = p.keys.uint32()
	p.sessions[s.processID] = s
}

// unregisterSession removes s from p.sessions; its process id may be drawn
// again from then on.
func (p *Pooler) unregisterSession(s *session) {
	p.sessionsMu.Lock()
	delete(p.sessions, s.processID)
	p.sessionsMu.Unlock()
}

// poolFor returns the pool of (user, database), creating it on first use.
// ok is false when the running configuration has no such pool (serves).
func (p *Pooler) poolFor(user, database string) (*Pool, bool) {
	key := poolKey{user: user, database: database}
	if view := p.poolsView.Load(); view != nil {
		if pool, ok := (*view)[key]; ok {
			return pool, true
		}
	}
	p.poolsMu.Lock()
	defer p.poolsMu.Unlock()
	if pool, ok := p.pools[key]; ok {
		return pool, true
	}
	state := p.state.Load()
	if !servesPool(state.cfg, key) {
		return nil, false
	}
	pool, ok := p.newPool(state, key)
	if !ok {
		return nil, false
	}
	p.pools[key] = pool
	p.publishPoolsLocked()
	return pool, true
}

// publishPoolsLocked stores a copy of p.pools as p.poolsView. A reader
// that loaded the view before a change sees the pools as they were just
// before it, as one that took poolsMu just before the change would have;
// a pool closed meanwhile answers ErrPoolClosed, on which its sessions ask
// poolFor again. p.poolsMu must be held.
func (p *Pooler) publishPoolsLocked() {
	view := maps.Clone(p.pools)
	p.poolsView.Store(&view)
}

// servesPool reports whether cfg has the pool of key: its database is
// configured and, without passthrough, users.toml has its user for it.
func servesPool(cfg *config.Config, key poolKey) bool {
	if _, ok := cfg.Database(key.database); !ok {
		return false
	}
	if cfg.General.PassthroughAuth.Enabled() {
		return true
	}
	_, ok := cfg.User(key.user, key.database)
	return ok
}

// newPool builds the pool of key from the configuration in state.
// p.poolsMu must be held.
func (p *Pooler) newPool(state *runtimeState, key poolKey) (*Pool, bool) {
	endpoint, settings, ok := poolConfig(state.cfg, key)
	if !ok {
		return nil, false
	}
	passthrough := state.cfg.General.PassthroughAuth.Enabled()
	registryKey := auth.Key{User: key.user, Database: key.database}
	var pool *Pool // the pool being built: it probes its server while it is down
	// Resolved once: a reload that changes the endpoint replaces the pool.
	target := p.target(endpoint.host, endpoint.port)
	connect := func(ctx context.Context) (*ServerConn, error) {
		e := endpoint
		if passthrough {
			password, known := p.registry.Password(registryKey)
			if !known {
				return nil, fmt.Errorf("no verified password for %s", key)
			}
			e.password = password
		}
		sc, err := p.openServer(ctx, target, e, pool)
		if passthrough && errors.Is(err, auth.ErrRejected) {
			// Postgres no longer accepts the stored password: drop it, so
			// refills fail locally ("no verified password") until a client
			// login verifies a new one, instead of retrying it on Postgres.
			p.registry.MarkStale(registryKey, e.password)
		}
		return sc, err
	}
	pool = newPool(key, settings, connect)
	pool.endpoint = endpoint
	pool.paused = p.paused.holds(key.database) // poolsMu is held: see Pooler.paused
	return pool, true
}

// poolConfig resolves the server endpoint and settings of one pool.
func poolConfig(cfg *config.Config, key poolKey) (serverEndpoint, poolSettings, bool) {
	resolved, ok := cfg.PoolSettings(key.user, key.database)
	if !ok {
		return serverEndpoint{}, poolSettings{}, false
	}
	general := cfg.General
	endpoint := serverEndpoint{
		host:           resolved.ServerHost,
		port:           resolved.ServerPort,
		database:       resolved.ServerDatabase,
		user:           resolved.ServerUser,
		password:       resolved.ServerPassword,
		connectTimeout: general.ConnectTimeout.Duration(),
		tlsVerify:      general.TLSVerify,
	}
	if general.PassthroughAuth.Enabled() {
		// Passthrough: server connections authenticate as the client's own
		// role with the password it presented (see docs/configuration.md).
		endpoint.user = key.user
		endpoint.password = ""
	}
	settings := poolSettings{
		size:            resolved.PoolSize,
		minSize:         resolved.MinPoolSize,
		mode:            resolved.PoolerMode,
		idleTimeout:     general.IdleTimeout.Duration(),
		serverLifetime:  general.ServerLifetime.Duration(),
		checkoutTimeout: general.CheckoutTimeout.Duration(),
		rollbackTimeout: general.RollbackTimeout.Duration(),

		healthcheckInterval:     general.HealthcheckInterval.Duration(),
		healthcheckTimeout:      general.HealthcheckTimeout.Duration(),
		idleHealthcheckInterval: general.IdleHealthcheckInterval.Duration(),
		idleHealthcheckDelay:    general.IdleHealthcheckDelay.Duration(),
		// Session mode keeps the client's own names: its server
		// connection is its own.
		preparedStatements:      general.PreparedStatements == "extended" && resolved.PoolerMode == config.PoolerModeTransaction,
		preparedStatementsLimit: general.PreparedStatementsLimit,
	}
	return endpoint, settings, true
}

// openServer opens one server connection to target, the server at
// endpoint's host and port (Pooler.target), waiting for one of the
// maxConcurrentServerConnects slots first. While the server is down it
// fails at once, unless this connect is the probe (serverTarget.admit).
// owner is the pool the connection is for (nil: a passthrough check, whose
// password is not known to be right); when the server is found down, the
// pool is what the maintenance loop probes it with while no client asks.
//
// The connect is bounded by connect_timeout and by shutdown, not by ctx: a
// caller that gives up first (a checkout deadline, which by default equals
// connect_timeout and started earlier, usually does) leaves it running, so
// that what it finds out is learned (a server that never answered is
// marked down, not forgotten as abandoned) and a connection it opens goes
// to owner, for the next client. PgBouncer's server connects do not belong
// to a client either (objects.c, launch_new_connection).
func (p *Pooler) openServer(ctx context.Context, target *serverTarget, endpoint serverEndpoint, owner *Pool) (*ServerConn, error) {
	probe, err := target.admit(time.Now())
	if err != nil {
		return nil, err
	}
	select {
	case p.connectSlots <- struct{}{}:
	case <-ctx.Done():
		target.record(time.Now(), probe, connectAbandoned, "", nil)
		return nil, fmt.Errorf("%w: waiting for a connect slot: %w", auth.ErrPasswordNotSent, ctx.Err())
	}
	p.connectsMu.Lock()
	if p.connectsClosed {
		p.connectsMu.Unlock()
		<-p.connectSlots
		target.record(time.Now(), probe, connectAbandoned, "", nil)
		return nil, fmt.Errorf("%w: %w", auth.ErrPasswordNotSent, ErrServerClosed)
	}
	p.connects.Add(1)
	p.connectsMu.Unlock()
	attempt := &serverConnect{done: make(chan struct{})}
	go p.runServerConnect(attempt, target, probe, endpoint, owner)
	select {
	case <-attempt.done:
	case <-ctx.Done():
		if attempt.state.CompareAndSwap(connectPending, connectLeft) {
			return nil, fmt.Errorf("%w: %w", errConnectGoesOn, ctx.Err())
		}
		<-attempt.done // it ended just now
	}
	return attempt.sc, attempt.err
}

// errConnectGoesOn is what openServer returns to a caller that gave up
// while its connect runs on. With an owner, the connect keeps the pool
// capacity its caller counted (Pool.open) until it ends.
var errConnectGoesOn = errors.New("gave up waiting for the server connect, which goes on for the pool")

// serverConnect is one connect running for openServer. Whichever of the
// connect (ending) and its caller (giving up) moves state from
// connectPending first decides who has the connection: the caller, or the
// connect itself, which then gives it to the pool.
type serverConnect struct {
	state atomic.Uint32
	done  chan struct{} // closed once sc and err are set, if the caller stayed
	sc    *ServerConn
	err   error
}

const (
	connectPending uint32 = iota
	connectDelivered
	connectLeft
)

// runServerConnect runs attempt, then hands its result to the caller, or
// when the caller has left, its connection (or the capacity the caller
// counted for it) to owner; without an owner, the connection is closed.
func (p *Pooler) runServerConnect(attempt *serverConnect, target *serverTarget, probe bool, endpoint serverEndpoint, owner *Pool) {
	defer p.connects.Done()
	sc, err := p.connectTarget(target, probe, endpoint, owner)
	<-p.connectSlots
	attempt.sc, attempt.err = sc, err
	if attempt.state.CompareAndSwap(connectPending, connectDelivered) {
		close(attempt.done)
		return
	}
	switch {
	case owner == nil:
		if sc != nil {
			sc.close()
		}
	case sc != nil:
		owner.connectFinished(sc)
	default:
		owner.connectFailed()
	}
}

// connectTarget opens a connection to target and records what the attempt
// showed about it. A panic ends only this attempt, like a panic in a
// session: it is logged, the probe (if this was one) is released, and the
// caller gets an error.
func (p *Pooler) connectTarget(target *serverTarget, probe bool, endpoint serverEndpoint, owner *Pool) (sc *ServerConn, err error) {
	recorded := false
	defer func() {
		if r := recover(); r != nil {
			p.log.Error("panic opening a server connection", zap.String("server", target.address),
				zap.Any("panic", r), zap.ByteString("stack", debug.Stack()))
			if !recorded {
				target.record(time.Now(), probe, connectAbandoned, "", nil)
			}
			sc, err = nil, fmt.Errorf("internal error in pgtender opening a server connection to %s", target.address)
		}
	}()
	prefer := endpoint.tlsVerify == config.TLSVerifyPrefer
	sc, refusedTLS, err := openServerConn(p.ctx, endpoint, p.state.Load().serverCAs, prefer && target.plaintextOnly(time.Now()))
	outcome, code := classifyConnect(err, p.ctx.Err() != nil)
	if outcome == connectUnreachable && owner != nil {
		target.probeWith(owner)
	}
	transition := target.record(time.Now(), probe, outcome, code, err)
	recorded = true
	if refusedTLS && outcome != connectUnreachable {
		target.rememberPlaintext(time.Now())
	}
	p.logTransition(target, transition, err)
	return sc, err
}

// verifyPassthrough is the registry's VerifyFunc: it proves a password by
// opening a real server connection with it, which then joins the pool.
func (p *Pooler) verifyPassthrough(ctx context.Context, key auth.Key, password string) error {
	state := p.state.Load()
	endpoint, _, ok := poolConfig(state.cfg, poolKey{user: key.User, database: key.Database})
	if !ok {
		return fmt.Errorf("%w: database %q is not configured", auth.ErrPasswordNotSent, key.Database)
	}
	endpoint.password = password
	sc, err := p.openServer(ctx, p.target(endpoint.host, endpoint.port), endpoint, nil)
	if err != nil {
		return err
	}
	pool, ok := p.poolFor(key.User, key.Database)
	if !ok {
		sc.close()
		return fmt.Errorf("database %q is not configured", key.Database)
	}
	pool.Add(sc)
	return nil
}

// poolList returns the pools now, for loops that must not hold poolsMu.
func (p *Pooler) poolList() []*Pool {
	p.poolsMu.Lock()
	defer p.poolsMu.Unlock()
	pools := make([]*Pool, 0, len(p.pools))
	for _, pool := range p.pools {
		pools = append(pools, pool)
	}
	return pools
}

// maintenanceLoop closes idle and old server connections and tops pools up
// to min_pool_size, once per maintenanceInterval.
func (p *Pooler) maintenanceLoop() {
	defer p.wg.Done()
	ticker := time.NewTicker(maintenanceInterval)
	defer ticker.Stop()
	for {
		select {
		case <-p.done:
			return
		case now := <-ticker.C:
			for _, pool := range p.poolList() {
				if missing := pool.maintain(now); missing > 0 && pool.growAllowed(now) {
					p.wg.Add(1)
					go p.growPool(pool)
				}
				p.checkIdleConnections(pool, now)
			}
			p.probeDownServers(now)
		}
	}
}

// checkIdleConnections starts the background health check of pool's idle
// connections (Pool.checkIdle) once the pool is idle_healthcheck_delay old,
// and logs the connections it closed.
func (p *Pooler) checkIdleConnections(pool *Pool, now time.Time) {
	settings := pool.settings.Load()
	if settings.idleHealthcheckInterval <= 0 || now.Sub(pool.createdAt) < settings.idleHealthcheckDelay {
		return
	}
	due := pool.takeForIdleCheck(now, settings.idleHealthcheckInterval)
	if len(due) == 0 {
		return
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		failed, first := pool.checkIdle(p.ctx, due, settings.healthcheckTimeout)
		if failed > 0 && p.ctx.Err() == nil {
			p.log.Warn("idle server connections failed their health check and were closed",
				zap.String("pool", pool.key.String()), zap.Int("failed", failed), zap.Int("checked", len(due)),
				zap.Duration("healthcheck_timeout", settings.healthcheckTimeout), zap.Error(first))
		}
	}()
}

// growPool opens one connection towards min_pool_size, backing off after a
// failure so that a refused password or a down server is not retried in a
// loop.
func (p *Pooler) growPool(pool *Pool) {
	defer p.wg.Done()
	err := pool.openIdle(p.ctx, pool.settings.Load().minSize) // the connect is bounded by connect_timeout (openServer)
	if serverDown(err) {
		// The server is down (this grow found it so, or it was not
		// attempted): its target's probes back off, not the pool, which
		// is topped up at the next tick after the server is back. The
		// target logs the outage once.
		pool.growDone(time.Now(), nil)
		return
	}
	pool.growDone(time.Now(), err)
	if err != nil && !p.draining.Load() {
		p.log.Warn("could not open a server connection for min_pool_size",
			zap.String("pool", pool.key.String()), zap.Error(err))
	}
}

// ClientCount is the number of client connections open now.
func (p *Pooler) ClientCount() int64 { return p.clientCount.Load() }
