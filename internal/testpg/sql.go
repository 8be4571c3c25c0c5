package testpg

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Exec runs sql (one or more statements, simple protocol) as the superuser
// on database postgres, over TCP with SCRAM.
func (s *Server) Exec(ctx context.Context, sql string) error {
	return s.withSuperuser(ctx, func(conn *pgconn.PgConn) error {
		_, err := conn.Exec(ctx, sql).ReadAll()
		return err
	})
}

// CreateRole creates a LOGIN role with a SCRAM-SHA-256 password (whatever
// password_encryption Options.Config set). name and password may hold any
// character but NUL; they are quoted, never interpolated raw.
func (s *Server) CreateRole(ctx context.Context, name, password string) error {
	if err := checkSQLText("role name", name); err != nil {
		return err
	}
	if strings.ContainsRune(password, 0) {
		return errors.New("testpg: a password cannot contain NUL")
	}
	return s.withSuperuser(ctx, func(conn *pgconn.PgConn) error {
		literal, err := conn.EscapeString(password)
		if err != nil {
			return err
		}
		// The SET lasts for this connection only, which is closed right after.
		sql := "SET password_encryption = 'scram-sha-256'; CREATE ROLE " +
			quoteIdent(name) + " LOGIN PASSWORD '" + literal + "'"
		if _, err := conn.Exec(ctx, sql).ReadAll(); err != nil {
			return fmt.Errorf("creating role %s: %w", quoteIdent(name), err)
		}
		return nil
	})
}

// CreateDatabase creates database name owned by owner, or by the superuser
// when owner is empty.
func (s *Server) CreateDatabase(ctx context.Context, name, owner string) error {
	if err := checkSQLText("database name", name); err != nil {
		return err
	}
	sql := "CREATE DATABASE " + quoteIdent(name)
	if owner != "" {
		if err := checkSQLText("owner", owner); err != nil {
			return err
		}
		sql += " OWNER " + quoteIdent(owner)
	}
	return s.Exec(ctx, sql)
}

// withSuperuser opens a superuser connection to database postgres for f and
// closes it afterwards.
func (s *Server) withSuperuser(ctx context.Context, f func(*pgconn.PgConn) error) error {
	conn, err := s.connect(ctx, "postgres")
	if err != nil {
		return fmt.Errorf("testpg: connecting as %s: %w", s.SuperUser, err)
	}
	err = f(conn)
	// Close sends Terminate and closes the socket even when ctx is done.
	closeErr := conn.Close(ctx)
	if err != nil {
		return fmt.Errorf("testpg: %w", err)
	}
	return closeErr
}

func (s *Server) connect(ctx context.Context, database string) (*pgconn.PgConn, error) {
	return pgconn.Connect(ctx, s.ConnString(s.SuperUser, s.SuperPassword, database))
}

func quoteIdent(name string) string { return pgx.Identifier{name}.Sanitize() }

// checkSQLText rejects what quoteIdent would silently change: an empty name
// or a NUL (Sanitize drops NULs).
func checkSQLText(what, name string) error {
	if name == "" {
		return fmt.Errorf("testpg: empty %s", what)
	}
	if strings.ContainsRune(name, 0) {
		return fmt.Errorf("testpg: %s %q contains NUL", what, name)
	}
	return nil
}
